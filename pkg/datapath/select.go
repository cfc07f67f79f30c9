package datapath

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
)

// Mode is the --datapath flag: which body leg kvgate uses.
type Mode string

const (
	// ModeAuto picks the path the benchmark showed better for token streams
	// (see AutoPrefersKernel and docs/body-leg.md), falling back to userspace
	// when the kernel path cannot be set up.
	ModeAuto Mode = "auto"
	// ModeSockmap requires the eBPF sockmap splice; startup fails without it.
	ModeSockmap Mode = "sockmap"
	// ModeUserspace always copies in userspace.
	ModeUserspace Mode = "userspace"
)

// AutoPrefersKernel records the benchmark's verdict (docs/body-leg.md,
// docs/benchmarks.md): --datapath=auto tries the sockmap splice, because for
// many concurrent token streams it cost far less proxy CPU (≈0.1–0.15× nginx)
// and less total CPU per chunk than the userspace copy. (Bulk bodies are
// faster in userspace; splice.OpenerFor keeps them there under auto.)
const AutoPrefersKernel = true

// ParseMode validates a --datapath value.
func ParseMode(s string) (Mode, error) {
	switch Mode(s) {
	case ModeAuto, ModeSockmap, ModeUserspace:
		return Mode(s), nil
	case "":
		return ModeAuto, nil
	}
	return "", fmt.Errorf("--datapath %q: want auto, sockmap or userspace", s)
}

// Stats is a scrape-time snapshot of a body leg.
//
// Path feeds kvgate_datapath_info{path=Path} 1. Moved feeds
// kvgate_spliced_bytes_total{path}: body bytes per path ("sockmap" is read
// from the BPF counters, "userspace" from the copy loop; a sockmap leg also
// reports the bytes it wrote itself — prefixes and small bodies — under
// "userspace").
type Stats struct {
	Path  string
	Moved map[string]uint64
}

// StatsReporter is implemented by body legs that can be scraped.
type StatsReporter interface {
	Stats() Stats
}

// KernelLeg is what the kernel path (package splice) provides.
type KernelLeg interface {
	BodyLeg
	StatsReporter
	io.Closer
}

// KernelOpener sets up the kernel path; package splice provides one. It
// returns an error wrapping ErrKernelUnavailable when the machine cannot run
// it (no privileges, old kernel, non-Linux build).
type KernelOpener func() (KernelLeg, error)

// ErrKernelUnavailable marks a kernel path that cannot run here.
var ErrKernelUnavailable = errors.New("kernel data path unavailable")

// Config chooses the body leg.
type Config struct {
	Mode Mode
	// BufSize is the userspace copy buffer (see NewUserspace).
	BufSize int
	// OpenKernel sets up the sockmap path; nil means it is not built in.
	OpenKernel KernelOpener
	Logger     *slog.Logger
}

// Selected is the body leg kvgate runs with, plus why it was chosen.
type Selected struct {
	BodyLeg
	// Reason says why this path was chosen (logged once at startup).
	Reason string
	stats  StatsReporter
	closer io.Closer
}

// Stats implements StatsReporter.
func (s *Selected) Stats() Stats { return s.stats.Stats() }

// Close releases the kernel path (detaches programs, removes pins).
func (s *Selected) Close() error {
	if s.closer == nil {
		return nil
	}
	return s.closer.Close()
}

// New picks the body leg for cfg.Mode and logs the choice once.
//
//   - userspace: the userspace copy.
//   - sockmap: the kernel splice, or an error when it cannot be set up.
//   - auto: the kernel splice when AutoPrefersKernel and it can be set up,
//     else the userspace copy (the reason is logged).
func New(cfg Config) (*Selected, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	user := NewUserspace(cfg.BufSize)
	pickUser := func(reason string) *Selected {
		log.Info("datapath selected", "path", user.Path(), "mode", string(cfg.Mode), "reason", reason)
		return &Selected{BodyLeg: user, Reason: reason, stats: user}
	}
	switch cfg.Mode {
	case ModeUserspace:
		return pickUser("--datapath=userspace"), nil
	case ModeAuto, "":
		if !AutoPrefersKernel {
			return pickUser("auto: this build prefers the userspace copy"), nil
		}
	case ModeSockmap:
	default:
		return nil, fmt.Errorf("--datapath %q: want auto, sockmap or userspace", cfg.Mode)
	}
	if cfg.OpenKernel == nil {
		err := fmt.Errorf("%w: built without the sockmap path", ErrKernelUnavailable)
		if cfg.Mode == ModeSockmap {
			return nil, err
		}
		return pickUser("auto: " + err.Error()), nil
	}
	k, err := cfg.OpenKernel()
	if err != nil {
		if cfg.Mode == ModeSockmap {
			return nil, fmt.Errorf("--datapath=sockmap: %w", err)
		}
		return pickUser("auto: sockmap unavailable, falling back: " + err.Error()), nil
	}
	reason := "--datapath=" + string(cfg.Mode)
	if cfg.Mode == ModeAuto || cfg.Mode == "" {
		reason = "auto: sockmap measured better for token streams (docs/body-leg.md)"
	}
	log.Info("datapath selected", "path", k.Path(), "mode", string(cfg.Mode), "reason", reason)
	return &Selected{BodyLeg: k, Reason: reason, stats: k, closer: k}, nil
}
