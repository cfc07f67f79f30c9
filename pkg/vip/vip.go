//go:build linux

package vip

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// StateFile is the name, inside the state directory, of the record of the
// addresses kvgate added.
const StateFile = "vips.json"

// maxRecorded bounds the ownership record read at start; a rule set has far
// fewer distinct VIPs.
const maxRecorded = 65536

// Observer is told how many addresses are on the device per owner ("kvgate"
// for the ones the Plumber added, "host" for claimed addresses that were
// already there).
type Observer interface {
	Addresses(owner string, n int)
}

type nopObserver struct{}

func (nopObserver) Addresses(string, int) {}

// Options configure a Plumber.
type Options struct {
	Device   string // the link to add VIPs to, e.g. "lo" or "eth0"
	StateDir string // where vips.json lives; "" keeps the record in memory only
	// Handle is the netlink handle to use; nil means the daemon's own network
	// namespace. Tests pass a handle into a namespace they made, and then
	// must pass that namespace as Namespace too.
	Handle *netlink.Handle
	// Namespace is the network namespace Handle works in, where announcements
	// are sent from; nil means the calling thread's own.
	Namespace *netns.NsHandle
	// Announce sends a gratuitous ARP for each IPv4 VIP added (for VIPs that
	// one host owns at a time; ECMP replicas leave it off).
	Announce bool
	Observer Observer
	Logger   *slog.Logger
}

// Plumber adds and removes rule VIPs on one device. Safe for concurrent use.
type Plumber struct {
	opts Options
	link netlink.Link

	mu sync.Mutex
	// claims counts the rules per address (one VIP may front several ports).
	claims map[netip.Addr]int
	// owned holds the addresses kvgate added, recorded in vips.json.
	owned map[netip.Addr]bool
	// claimedSinceOpen marks recorded addresses a rule claimed again after a
	// restart; Prune removes the rest.
	claimedSinceOpen map[netip.Addr]bool
}

// Open finds the device and reads the ownership record. A recorded address
// that is no longer on the device is dropped from the record.
func Open(opts Options) (*Plumber, error) {
	if opts.Device == "" {
		return nil, errors.New("vip: --vip-dev: empty device name")
	}
	if opts.Handle == nil {
		h, err := netlink.NewHandle()
		if err != nil {
			return nil, fmt.Errorf("vip: netlink: %w", err)
		}
		opts.Handle = h
	}
	if opts.Observer == nil {
		opts.Observer = nopObserver{}
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	link, err := opts.Handle.LinkByName(opts.Device)
	if err != nil {
		return nil, fmt.Errorf("vip: --vip-dev %q: %w", opts.Device, err)
	}
	p := &Plumber{opts: opts, link: link, claims: map[netip.Addr]int{}, owned: map[netip.Addr]bool{},
		claimedSinceOpen: map[netip.Addr]bool{}}
	recorded, err := p.readRecord()
	if err != nil {
		return nil, err
	}
	onDev, err := p.deviceAddrs()
	if err != nil {
		return nil, err
	}
	for _, a := range recorded {
		if onDev[a] {
			p.owned[a] = true
		}
	}
	if len(p.owned) != len(recorded) {
		if err := p.writeRecord(); err != nil {
			return nil, err
		}
	}
	p.report()
	return p, nil
}

// Claim makes addr answer on the device for one more rule. The first claim of
// an address that is not on the device adds it and records it as kvgate's.
func (p *Plumber) Claim(addr netip.Addr) error {
	addr = addr.Unmap()
	if !addr.IsValid() || addr.IsUnspecified() {
		return fmt.Errorf("vip: %s: not a plumbable address", addr)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.claims[addr] > 0 {
		p.claims[addr]++
		return nil
	}
	if p.owned[addr] {
		// Added by an earlier run (the record says so) and still there.
		p.claims[addr] = 1
		p.claimedSinceOpen[addr] = true
		return nil
	}
	onDev, err := p.deviceAddrs()
	if err != nil {
		return err
	}
	if onDev[addr] {
		p.claims[addr] = 1
		p.opts.Logger.Info("VIP already on the device; kvgate will not remove it", "vip", addr, "dev", p.opts.Device)
		p.report()
		return nil
	}
	// Record first: a crash between the two steps leaves a recorded address
	// that is not on the device, which Open drops; never an unrecorded one.
	p.owned[addr] = true
	if err := p.writeRecord(); err != nil {
		delete(p.owned, addr)
		return err
	}
	if err := p.opts.Handle.AddrAdd(p.link, hostAddr(addr)); err != nil && !errors.Is(err, unix.EEXIST) {
		delete(p.owned, addr)
		_ = p.writeRecord()
		return fmt.Errorf("vip: add %s to %s: %w", addr, p.opts.Device, err)
	}
	p.claims[addr] = 1
	p.claimedSinceOpen[addr] = true
	p.opts.Logger.Info("VIP added", "vip", addr, "dev", p.opts.Device)
	if p.opts.Announce {
		if err := inNamespace(p.opts.Namespace, func() error { return announce(p.link, addr) }); err != nil {
			p.opts.Logger.Warn("gratuitous ARP failed", "vip", addr, "dev", p.opts.Device, "err", err)
		}
	}
	p.report()
	return nil
}

// Release drops one rule's claim on addr; the last release of an address
// kvgate added removes it from the device.
func (p *Plumber) Release(addr netip.Addr) error {
	addr = addr.Unmap()
	p.mu.Lock()
	defer p.mu.Unlock()
	n := p.claims[addr]
	if n == 0 {
		return nil
	}
	if n > 1 {
		p.claims[addr] = n - 1
		return nil
	}
	delete(p.claims, addr)
	delete(p.claimedSinceOpen, addr)
	defer p.report()
	if !p.owned[addr] {
		return nil
	}
	return p.removeOwned(addr)
}

// Prune removes the recorded addresses that no rule claimed since Open: VIPs
// of rules deleted while kvgate was down. Call it once the persisted rules
// have been restored.
func (p *Plumber) Prune() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for a := range p.owned {
		if !p.claimedSinceOpen[a] {
			errs = append(errs, p.removeOwned(a))
		}
	}
	p.report()
	return errors.Join(errs...)
}

// Close removes every address kvgate added, whatever claims remain (the
// daemon is exiting), and keeps the operator's.
func (p *Plumber) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for a := range p.owned {
		errs = append(errs, p.removeOwned(a))
	}
	clear(p.claims)
	clear(p.claimedSinceOpen)
	p.report()
	return errors.Join(errs...)
}

// Owned lists the addresses kvgate added, sorted.
func (p *Plumber) Owned() []netip.Addr {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]netip.Addr, 0, len(p.owned))
	for a := range p.owned {
		out = append(out, a)
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return out
}

// removeOwned deletes an address kvgate added; the caller holds p.mu.
func (p *Plumber) removeOwned(addr netip.Addr) error {
	err := p.opts.Handle.AddrDel(p.link, hostAddr(addr))
	if err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("vip: remove %s from %s: %w", addr, p.opts.Device, err)
	}
	delete(p.owned, addr)
	delete(p.claimedSinceOpen, addr)
	p.opts.Logger.Info("VIP removed", "vip", addr, "dev", p.opts.Device)
	return p.writeRecord()
}

func (p *Plumber) report() {
	kv := len(p.owned)
	host := 0
	for a := range p.claims {
		if !p.owned[a] {
			host++
		}
	}
	p.opts.Observer.Addresses("kvgate", kv)
	p.opts.Observer.Addresses("host", host)
}

func (p *Plumber) deviceAddrs() (map[netip.Addr]bool, error) {
	addrs, err := p.opts.Handle.AddrList(p.link, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("vip: list addresses of %s: %w", p.opts.Device, err)
	}
	out := make(map[netip.Addr]bool, len(addrs))
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out[ip.Unmap()] = true
		}
	}
	return out, nil
}

// inNamespace runs fn on a thread inside ns (nil: where it is), so sockets
// fn makes belong to the namespace whose link they send on.
func inNamespace(ns *netns.NsHandle, fn func() error) error {
	if ns == nil {
		return fn()
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return fmt.Errorf("current namespace: %w", err)
	}
	defer orig.Close()
	if err := netns.Set(*ns); err != nil {
		return fmt.Errorf("enter namespace: %w", err)
	}
	defer func() { _ = netns.Set(orig) }()
	return fn()
}

func hostAddr(a netip.Addr) *netlink.Addr {
	bits := 32
	if a.Is6() {
		bits = 128
	}
	return &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, bits)}}
}

// record is the on-disk shape of vips.json.
type record struct {
	Device string   `json:"device"`
	Owned  []string `json:"owned"`
}

func (p *Plumber) recordPath() string {
	if p.opts.StateDir == "" {
		return ""
	}
	return filepath.Join(p.opts.StateDir, StateFile)
}

func (p *Plumber) readRecord() ([]netip.Addr, error) {
	path := p.recordPath()
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("vip: read %s: %w", path, err)
	}
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("vip: %s: %w", path, err)
	}
	if r.Device != p.opts.Device {
		// Addresses recorded on another device are not this run's to manage.
		p.opts.Logger.Warn("VIP record names another device; ignoring it", "file", path, "recorded", r.Device, "dev", p.opts.Device)
		return nil, nil
	}
	if len(r.Owned) > maxRecorded {
		return nil, fmt.Errorf("vip: %s: %d addresses, more than %d", path, len(r.Owned), maxRecorded)
	}
	out := make([]netip.Addr, 0, len(r.Owned))
	for _, s := range r.Owned {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("vip: %s: owned address %q: %w", path, s, err)
		}
		out = append(out, a.Unmap())
	}
	return out, nil
}

// writeRecord replaces vips.json atomically; the caller holds p.mu (or is Open).
func (p *Plumber) writeRecord() error {
	path := p.recordPath()
	if path == "" {
		return nil
	}
	r := record{Device: p.opts.Device, Owned: make([]string, 0, len(p.owned))}
	for a := range p.owned {
		r.Owned = append(r.Owned, a.String())
	}
	slices.Sort(r.Owned)
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("vip: encode record: %w", err)
	}
	tmp, err := os.CreateTemp(p.opts.StateDir, StateFile+".tmp*")
	if err != nil {
		return fmt.Errorf("vip: write record: %w", err)
	}
	_, werr := tmp.Write(b)
	if werr == nil {
		werr = tmp.Sync()
	}
	if cerr := tmp.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp.Name(), path)
	}
	if werr != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("vip: write %s: %w", path, werr)
	}
	return nil
}
