//go:build linux

package splice

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"

	"github.com/kvgate/kvgate/pkg/datapath"
)

// DefaultPinDir is the default --bpf-pin-dir.
const DefaultPinDir = "/sys/fs/bpf/kvgate"

// DefaultThreshold is the body size above which a non-streamed body is spliced.
const DefaultThreshold = 64 << 10

// Config configures the kernel data path.
type Config struct {
	// PinDir is --bpf-pin-dir; each instance pins under PinDir/Instance.
	PinDir string
	// Instance names this kvgate's pin subdirectory. Use a name that is
	// stable across restarts of the same instance (the daemon derives it from
	// its listen address or state dir) so stale pins of a crashed run are
	// recognised and removed. Must be a single path element without a dot (bpffs refuses dots).
	Instance string
	// CgroupPath is where the sock_ops load counter attaches; empty means
	// the cgroup v2 root found in /proc/self/mountinfo.
	CgroupPath string
	// Threshold: non-streamed bodies with a declared length below it stay in
	// userspace. 0 means DefaultThreshold; negative splices every body.
	Threshold int64
	// StreamedOnly splices only token streams (datapath.Options.TokenStream:
	// text/event-stream or application/x-ndjson bodies) whatever their
	// length or framing; --datapath=auto sets it (see OpenerFor): bulk
	// bodies, chunked JSON included, moved faster through the userspace copy.
	StreamedOnly bool
	// BufSize is the buffer of the userspace copy used for small bodies.
	BufSize int
	Logger  *slog.Logger
}

// Datapath is the loaded kernel data path: the sockmap body leg, the load
// map and their pins. It implements datapath.KernelLeg.
type Datapath struct {
	cfg     Config
	log     *slog.Logger
	objs    spliceObjects
	cg      link.Link
	pinDir  string
	lock    *os.File
	user    *datapath.Userspace
	closed  atomic.Bool
	cgroup  string
	stopped chan struct{}
	// drainBufs hold the pre-splice drain of backend receive queues;
	// drainHeld counts the ones out of the pool.
	drainBufs sync.Pool
	drainHeld atomic.Int64
	ends      *endWatch
	// beforeInsert, when set (tests only), runs between the pre-splice
	// drain and the sockhash insertion, to widen that window.
	beforeInsert func()
}

// OpenerFor returns the kernel opener for a --datapath mode: under auto the
// splice takes streamed bodies only (where the benchmark showed it better);
// under sockmap it also takes bodies whose length reaches the threshold.
func OpenerFor(mode datapath.Mode, cfg Config) datapath.KernelOpener {
	if mode == datapath.ModeAuto || mode == "" {
		cfg.StreamedOnly = true
	}
	return Opener(cfg)
}

// Opener returns a datapath.KernelOpener for cfg, for datapath.New.
func Opener(cfg Config) datapath.KernelOpener {
	return func() (datapath.KernelLeg, error) {
		d, err := Open(cfg)
		if err != nil {
			return nil, err
		}
		return d, nil
	}
}

// Open loads the BPF programs, attaches them, and pins maps and programs
// under PinDir/Instance (mounting bpffs at /sys/fs/bpf when missing).
// Errors that mean "this machine cannot do it" wrap datapath.ErrKernelUnavailable.
func Open(cfg Config) (*Datapath, error) {
	if cfg.PinDir == "" {
		cfg.PinDir = DefaultPinDir
	}
	if cfg.Instance == "" {
		cfg.Instance = "default"
	}
	if strings.ContainsAny(cfg.Instance, "/\x00.") {
		// bpffs refuses names with a dot (EPERM), which would read as "no BPF here".
		return nil, fmt.Errorf("bpf pin instance %q: must be a single path element without '.'", cfg.Instance)
	}
	if cfg.Threshold == 0 {
		cfg.Threshold = DefaultThreshold
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	d := &Datapath{cfg: cfg, log: cfg.Logger, user: datapath.NewUserspace(cfg.BufSize), stopped: make(chan struct{})}

	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("%w: %w", datapath.ErrKernelUnavailable, err)
	}
	cg := cfg.CgroupPath
	if cg == "" {
		var err error
		if cg, err = cgroup2Root(); err != nil {
			return nil, fmt.Errorf("%w: %w", datapath.ErrKernelUnavailable, err)
		}
	}
	d.cgroup = cg

	if err := ensureBPFFS(cfg.PinDir); err != nil {
		return nil, fmt.Errorf("%w: %w", datapath.ErrKernelUnavailable, err)
	}
	dir := filepath.Join(cfg.PinDir, cfg.Instance)
	lock, err := claimPinDir(dir, d.log)
	if err != nil {
		return nil, err
	}
	d.lock, d.pinDir = lock, dir

	if err := loadSpliceObjects(&d.objs, nil); err != nil {
		d.release()
		if errors.Is(err, unix.EPERM) || errors.Is(err, ebpf.ErrNotSupported) {
			return nil, fmt.Errorf("%w: loading BPF objects: %w", datapath.ErrKernelUnavailable, err)
		}
		return nil, fmt.Errorf("loading BPF objects: %w", err)
	}
	if err := link.RawAttachProgram(link.RawAttachProgramOptions{
		Target:  d.objs.Backends.FD(),
		Program: d.objs.SpliceVerdict,
		Attach:  ebpf.AttachSkSKBStreamVerdict,
	}); err != nil {
		d.release()
		return nil, fmt.Errorf("%w: attaching the stream verdict to the backends sockhash: %w", datapath.ErrKernelUnavailable, err)
	}
	d.cg, err = link.AttachCgroup(link.CgroupOptions{Path: cg, Attach: ebpf.AttachCGroupSockOps, Program: d.objs.EndpointLoad})
	if err != nil {
		d.release()
		return nil, fmt.Errorf("%w: attaching sock_ops to cgroup %s: %w", datapath.ErrKernelUnavailable, cg, err)
	}
	if err := d.pin(); err != nil {
		d.release()
		return nil, err
	}
	if d.ends, err = newEndWatch(d); err != nil {
		d.release()
		return nil, fmt.Errorf("%w: reading the ends ring buffer: %w", datapath.ErrKernelUnavailable, err)
	}
	d.log.Info("sockmap data path loaded", "pin_dir", dir, "cgroup", cg, "threshold", cfg.Threshold)
	return d, nil
}

// PinDir is this instance's pin directory (for bpftool map dump pinned …).
func (d *Datapath) PinDir() string { return d.pinDir }

// Path implements datapath.BodyLeg.
func (*Datapath) Path() string { return "sockmap" }

// pinned lists every object pinned, by its file name.
func (d *Datapath) pinned() map[string]interface{ Pin(string) error } {
	return map[string]interface{ Pin(string) error }{
		"backends":       d.objs.Backends,
		"clients":        d.objs.Clients,
		"pairs":          d.objs.Pairs,
		"ep_loads":       d.objs.EpLoads,
		"endpoints":      d.objs.Endpoints,
		"totals":         d.objs.Totals,
		"ends":           d.objs.Ends,
		"conn_states":    d.objs.ConnStates,
		"splice_verdict": d.objs.SpliceVerdict,
		"endpoint_load":  d.objs.EndpointLoad,
	}
}

func (d *Datapath) pin() error {
	for name, o := range d.pinned() {
		if err := o.Pin(filepath.Join(d.pinDir, name)); err != nil {
			return fmt.Errorf("pinning %s under %s: %w", name, d.pinDir, err)
		}
	}
	return nil
}

// Close detaches the programs, removes the pins and the instance directory.
// Legs still running are not waited for; call it after the proxy drained.
func (d *Datapath) Close() error {
	if d.closed.Swap(true) {
		return nil
	}
	return d.release()
}

func (d *Datapath) release() error {
	var errs []error
	if d.ends != nil {
		errs = append(errs, d.ends.close())
	}
	if d.cg != nil {
		errs = append(errs, d.cg.Close())
	}
	if d.objs.SpliceVerdict != nil && d.objs.Backends != nil {
		_ = link.RawDetachProgram(link.RawDetachProgramOptions{
			Target: d.objs.Backends.FD(), Program: d.objs.SpliceVerdict, Attach: ebpf.AttachSkSKBStreamVerdict,
		})
	}
	if d.pinDir != "" {
		errs = append(errs, removePins(d.pinDir))
	}
	errs = append(errs, d.objs.Close())
	if d.lock != nil {
		errs = append(errs, d.lock.Close())
	}
	return errors.Join(errs...)
}

// claimPinDir creates dir and takes an exclusive flock on it, held for the
// life of the process (the kernel drops it if kvgate crashes). A dir that is
// locked belongs to a live instance: refuse. A dir that is not locked but
// holds pins is a crashed run's leftover under our own name: remove them.
func claimPinDir(dir string, log *slog.Logger) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("%w: creating pin dir: %w", datapath.ErrKernelUnavailable, err)
	}
	f, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("opening pin dir %s: %w", dir, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("pin dir %s is in use by another running kvgate instance (choose another instance name)", dir)
		}
		return nil, fmt.Errorf("locking pin dir %s: %w", dir, err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("reading pin dir %s: %w", dir, err)
	}
	if len(entries) > 0 {
		names := make([]string, 0, len(entries))
		for _, e := range entries {
			names = append(names, e.Name())
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
				f.Close()
				return nil, fmt.Errorf("removing stale pin %s: %w", e.Name(), err)
			}
		}
		log.Warn("removed stale BPF pins of a previous run of this instance", "pin_dir", dir, "pins", names)
	}
	return f, nil
}

// removePins unpins everything in dir and removes dir itself.
func removePins(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("reading pin dir: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

const bpfFSMagic = 0xcafe4a11

// ensureBPFFS makes sure pinDir lies on a bpffs, mounting one at
// /sys/fs/bpf when pinDir is under it and nothing is mounted there.
func ensureBPFFS(pinDir string) error {
	probe := pinDir
	for {
		if _, err := os.Stat(probe); err == nil {
			break
		}
		parent := filepath.Dir(probe)
		if parent == probe {
			break
		}
		probe = parent
	}
	var st unix.Statfs_t
	if err := unix.Statfs(probe, &st); err == nil && st.Type == bpfFSMagic {
		return nil
	}
	const bpffs = "/sys/fs/bpf"
	if pinDir != bpffs && !strings.HasPrefix(pinDir, bpffs+"/") {
		return fmt.Errorf("--bpf-pin-dir %s is not on a bpf filesystem", pinDir)
	}
	if err := unix.Statfs(bpffs, &st); err == nil && st.Type == bpfFSMagic {
		return nil
	}
	if err := os.MkdirAll(bpffs, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", bpffs, err)
	}
	if err := unix.Mount("bpf", bpffs, "bpf", 0, "mode=0700"); err != nil && !errors.Is(err, unix.EBUSY) {
		return fmt.Errorf("mounting bpffs at %s: %w", bpffs, err)
	}
	return nil
}

// cgroup2Root finds the cgroup v2 mount (/sys/fs/cgroup on unified
// layouts, /sys/fs/cgroup/unified on hybrid ones).
func cgroup2Root() (string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", fmt.Errorf("reading mountinfo: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		// ... mountpoint ... - fstype source opts
		left, right, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		rf := strings.Fields(right)
		lf := strings.Fields(left)
		if len(rf) > 0 && rf[0] == "cgroup2" && len(lf) > 4 {
			return lf[4], nil
		}
	}
	return "", errors.New("no cgroup v2 mount found")
}
