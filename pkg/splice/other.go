//go:build !linux

package splice

import (
	"fmt"
	"log/slog"
	"runtime"

	"github.com/kvgate/kvgate/pkg/datapath"
)

// DefaultPinDir is the default --bpf-pin-dir.
const DefaultPinDir = "/sys/fs/bpf/kvgate"

// DefaultThreshold is the body size above which a non-streamed body is spliced.
const DefaultThreshold = 64 << 10

// Config configures the kernel data path (Linux only).
type Config struct {
	PinDir, Instance, CgroupPath string
	Threshold                    int64
	StreamedOnly                 bool
	BufSize                      int
	Logger                       *slog.Logger
}

// OpenerFor reports that the sockmap path needs Linux.
func OpenerFor(_ datapath.Mode, cfg Config) datapath.KernelOpener { return Opener(cfg) }

// Opener reports that the sockmap path needs Linux.
func Opener(Config) datapath.KernelOpener {
	return func() (datapath.KernelLeg, error) {
		return nil, fmt.Errorf("%w: sockmap needs Linux, this is %s", datapath.ErrKernelUnavailable, runtime.GOOS)
	}
}
