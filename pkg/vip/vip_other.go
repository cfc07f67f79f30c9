//go:build !linux

package vip

import (
	"errors"
	"log/slog"
	"net/netip"
)

// Observer is told how many addresses are on the device per owner.
type Observer interface {
	Addresses(owner string, n int)
}

// Options configure a Plumber; on this system Open always fails.
type Options struct {
	Device, StateDir string
	Announce         bool
	Observer         Observer
	Logger           *slog.Logger
}

// Plumber needs netlink, which only Linux has.
type Plumber struct{}

var errNotLinux = errors.New("vip: --vip-dev needs Linux (netlink)")

// Open reports that VIP plumbing needs Linux.
func Open(Options) (*Plumber, error) { return nil, errNotLinux }

func (*Plumber) Claim(netip.Addr) error   { return errNotLinux }
func (*Plumber) Release(netip.Addr) error { return errNotLinux }
func (*Plumber) Prune() error             { return errNotLinux }
func (*Plumber) Close() error             { return errNotLinux }
func (*Plumber) Owned() []netip.Addr      { return nil }
