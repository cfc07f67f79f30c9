//go:build linux

package splice

import (
	"errors"
	"fmt"
	"net/netip"
	"syscall"
	"time"

	"github.com/cilium/ebpf"

	"github.com/kvgate/kvgate/pkg/datapath"
)

// MaxEndpoints is the size of the load map (pkg/epset's limit).
const MaxEndpoints = 256

// EndpointLoad is one row of the BPF load map.
type EndpointLoad struct {
	// ActiveConns counts established TCP connections to the endpoint's
	// registered addresses (sock_ops on the cgroup v2 root).
	ActiveConns uint64
	// SplicedBytes counts body bytes the kernel spliced from the endpoint.
	SplicedBytes uint64
	// Streams counts spliced responses that carried at least one byte.
	Streams uint64
	// FirstByte is when the latest spliced response's first body byte was
	// redirected (zero if none).
	FirstByte time.Time
}

// SetEndpoint registers addr as endpoint index idx, so sock_ops counts
// connections to it and spliced bytes are attributed to it. An endpoint may
// have several addresses. Counters for idx are kept.
func (d *Datapath) SetEndpoint(idx int, addr netip.AddrPort) error {
	if idx < 0 || idx >= MaxEndpoints {
		return fmt.Errorf("endpoint index %d: want 0..%d", idx, MaxEndpoints-1)
	}
	if !addr.IsValid() {
		return errors.New("endpoint address is not valid")
	}
	k := epKey(addr)
	v := uint32(idx)
	if err := d.objs.Endpoints.Update(&k, &v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("registering endpoint %d (%s): %w", idx, addr, err)
	}
	return nil
}

// TagBackend marks a socket, before it connects, as a backend connection of
// this instance's proxy; use it as net.Dialer.Control. Only tagged
// connections to registered endpoints are counted in the load map, so a
// health probe or metrics scrape of the same address, or another kvgate
// instance's connections, are not counted as load. An error means the
// connection will not be counted (it still works).
func (d *Datapath) TagBackend(_, _ string, c syscall.RawConn) error {
	if d.closed.Load() {
		return errors.New("tagging a backend socket: the data path is closed")
	}
	v := spliceConnState{Backend: 1}
	var uerr error
	if err := c.Control(func(fd uintptr) {
		uerr = d.objs.ConnStates.Update(uint32(fd), &v, ebpf.UpdateAny)
	}); err != nil {
		return fmt.Errorf("tagging a backend socket: %w", err)
	}
	if uerr != nil {
		return fmt.Errorf("tagging a backend socket: %w", uerr)
	}
	return nil
}

// RemoveEndpoint forgets addr. Connections already counted are still
// decremented when they close.
func (d *Datapath) RemoveEndpoint(addr netip.AddrPort) error {
	k := epKey(addr)
	if err := d.objs.Endpoints.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("removing endpoint %s: %w", addr, err)
	}
	return nil
}

// EndpointLoad reads one endpoint's row of the load map.
func (d *Datapath) EndpointLoad(idx int) (EndpointLoad, error) {
	if idx < 0 || idx >= MaxEndpoints {
		return EndpointLoad{}, fmt.Errorf("endpoint index %d: want 0..%d", idx, MaxEndpoints-1)
	}
	var v spliceEpLoad
	if err := d.objs.EpLoads.Lookup(uint32(idx), &v); err != nil {
		return EndpointLoad{}, fmt.Errorf("reading load map: %w", err)
	}
	l := EndpointLoad{ActiveConns: v.ActiveConns, SplicedBytes: v.SplicedBytes, Streams: v.Streams}
	if v.FirstByteNs != 0 {
		l.FirstByte = monoToTime(v.FirstByteNs)
	}
	return l, nil
}

// ActiveConns reads one endpoint's established-connection count from the
// load map (the part of EndpointLoad the daemon compares with its counts).
func (d *Datapath) ActiveConns(idx int) (uint64, error) {
	l, err := d.EndpointLoad(idx)
	return l.ActiveConns, err
}

// SplicedBytes is the total the kernel spliced for this instance.
func (d *Datapath) SplicedBytes() uint64 {
	var v uint64
	_ = d.objs.Totals.Lookup(uint32(0), &v)
	return v
}

// Stats implements datapath.StatsReporter (kvgate_datapath_info and
// kvgate_spliced_bytes_total; the sockmap figure is read from BPF).
func (d *Datapath) Stats() datapath.Stats {
	u := d.user.Stats()
	return datapath.Stats{Path: d.Path(), Moved: map[string]uint64{
		"sockmap":   d.SplicedBytes(),
		"userspace": u.Moved["userspace"],
	}}
}

// Entries counts the live entries of the per-connection maps (backends,
// clients, pairs): all zero at rest. Tests use it to prove nothing leaks.
func (d *Datapath) Entries() (backends, clients, pairs int, err error) {
	count := func(m *ebpf.Map) (int, error) {
		var k, next uint64
		n := 0
		var kp any
		for {
			if err := m.NextKey(kp, &next); err != nil {
				if errors.Is(err, ebpf.ErrKeyNotExist) {
					return n, nil
				}
				return n, err
			}
			n++
			if n > 1<<20 {
				return n, errors.New("map iteration did not end")
			}
			k = next
			kp = &k
		}
	}
	if backends, err = count(d.objs.Backends); err != nil {
		return
	}
	if clients, err = count(d.objs.Clients); err != nil {
		return
	}
	pairs, err = count(d.objs.Pairs)
	return
}
