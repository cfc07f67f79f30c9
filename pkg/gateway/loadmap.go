package gateway

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"syscall"

	"github.com/kvgate/kvgate/pkg/config"
)

// bpfLoadMap is the optional part of the kernel body leg (splice.Datapath)
// that keeps the BPF per-endpoint load map: an address registered under a
// slot has its established backend connections counted in the kernel.
type bpfLoadMap interface {
	SetEndpoint(idx int, addr netip.AddrPort) error
	RemoveEndpoint(addr netip.AddrPort) error
	ActiveConns(idx int) (uint64, error)
	// TagBackend marks a proxy backend socket before connect(): only
	// tagged connections count, not health probes or metrics scrapes.
	TagBackend(network, address string, c syscall.RawConn) error
}

// maxLoadSlots is the size of the BPF load map (splice.MaxEndpoints).
const maxLoadSlots = 256

// errNoLoadMap: the body leg keeps no BPF load map (userspace data path).
var errNoLoadMap = errors.New("the data path keeps no BPF load map (not on the sockmap path)")

// endpointRef names one endpoint of one rule.
type endpointRef struct{ service, ep int }

// loadSlots assigns BPF load-map slots. The map is keyed by backend address
// and one map serves every rule, so a slot belongs to an address, shared by
// every (service, ep_idx) that points at it: the kernel counts connections
// to the address, whichever rule opened them.
type loadSlots struct {
	lm  bpfLoadMap
	log *slog.Logger

	mu     sync.Mutex
	slot   map[netip.AddrPort]int
	users  map[netip.AddrPort]map[endpointRef]struct{}
	addrOf map[endpointRef]netip.AddrPort
	used   [maxLoadSlots]bool
	// next is where the search for a free slot starts: slots are handed out
	// round-robin so a just-freed slot, whose old connections may still be
	// closing, is reused last.
	next int
}

func newLoadSlots(lm bpfLoadMap, log *slog.Logger) *loadSlots {
	return &loadSlots{lm: lm, log: log, slot: map[netip.AddrPort]int{},
		users: map[netip.AddrPort]map[endpointRef]struct{}{}, addrOf: map[endpointRef]netip.AddrPort{}}
}

// endpointAddr is the address the proxy dials for e.
func endpointAddr(e config.Endpoint) (netip.AddrPort, error) {
	a, err := netip.ParseAddr(e.IP)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("endpoint %s: %w", e.Key(), err)
	}
	if e.TargetPort <= 0 || e.TargetPort > 65535 {
		return netip.AddrPort{}, fmt.Errorf("endpoint %s: port out of range", e.Key())
	}
	return netip.AddrPortFrom(a.Unmap(), uint16(e.TargetPort)), nil
}

// set registers (service, e) with the load map. A failure is logged, not
// returned: the proxy's in-flight counts, not the map, feed the cap.
func (s *loadSlots) set(service int, e config.Endpoint) {
	ap, err := endpointAddr(e)
	if err != nil {
		s.log.Warn("BPF load map: endpoint not counted", "service", service, "ep", e.Idx, "err", err)
		return
	}
	ref := endpointRef{service, e.Idx}
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.addrOf[ref]; ok {
		if old == ap {
			return
		}
		s.dropLocked(ref)
	}
	if _, ok := s.slot[ap]; !ok {
		idx := -1
		for i := range maxLoadSlots {
			if j := (s.next + i) % maxLoadSlots; !s.used[j] {
				idx = j
				break
			}
		}
		if idx < 0 {
			s.log.Warn("BPF load map full; endpoint not counted", "service", service, "ep", e.Idx, "addr", ap, "slots", maxLoadSlots)
			return
		}
		if err := s.lm.SetEndpoint(idx, ap); err != nil {
			s.log.Warn("BPF load map: endpoint not counted", "service", service, "ep", e.Idx, "err", err)
			return
		}
		s.used[idx], s.slot[ap], s.users[ap] = true, idx, map[endpointRef]struct{}{}
		s.next = (idx + 1) % maxLoadSlots
	}
	s.users[ap][ref] = struct{}{}
	s.addrOf[ref] = ap
}

// remove forgets (service, ep); the address leaves the map with its last user.
func (s *loadSlots) remove(service, ep int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dropLocked(endpointRef{service, ep})
}

func (s *loadSlots) dropLocked(ref endpointRef) {
	ap, ok := s.addrOf[ref]
	if !ok {
		return
	}
	delete(s.addrOf, ref)
	delete(s.users[ap], ref)
	if len(s.users[ap]) > 0 {
		return
	}
	if err := s.lm.RemoveEndpoint(ap); err != nil {
		s.log.Warn("BPF load map: removing endpoint", "addr", ap, "err", err)
	}
	// The slot's counters are kept by the kernel; connections still open
	// decrement it when they close, so it is only reused once free.
	s.used[s.slot[ap]] = false
	delete(s.slot, ap)
	delete(s.users, ap)
}

// activeConns reads the kernel's count of established connections to
// (service, ep)'s address.
func (s *loadSlots) activeConns(service, ep int) (uint64, error) {
	s.mu.Lock()
	ap, ok := s.addrOf[endpointRef{service, ep}]
	idx := s.slot[ap]
	s.mu.Unlock()
	if !ok {
		return 0, fmt.Errorf("service %d endpoint %d: not in the BPF load map", service, ep)
	}
	return s.lm.ActiveConns(idx)
}

// BPFActiveConns reads the BPF load map's count of established backend
// connections to a rule's endpoint (its address; shared with any other rule
// pointing at the same address). At rest it agrees with Loads (tests check
// it). It fails when the data path is not the sockmap one.
func (g *Gateway) BPFActiveConns(serviceID, epIdx int) (uint64, error) {
	if g.slots == nil {
		return 0, errNoLoadMap
	}
	return g.slots.activeConns(serviceID, epIdx)
}

// dialControl is the proxies' backend dialer hook: it tags each backend
// socket so the BPF load map counts it. nil without a load map.
func (g *Gateway) dialControl() func(network, address string, c syscall.RawConn) error {
	if g.slots == nil {
		return nil
	}
	return func(network, address string, c syscall.RawConn) error {
		if err := g.slots.lm.TagBackend(network, address, c); err != nil {
			// The connection works; only the load map misses it.
			g.log.Debug("BPF load map: backend connection not tagged", "addr", address, "err", err)
		}
		return nil
	}
}

// registerEndpoints puts every endpoint of rule in the BPF load map.
func (g *Gateway) registerEndpoints(rule *config.Rule) {
	if g.slots == nil {
		return
	}
	for _, e := range rule.Endpoints {
		g.slots.set(rule.ServiceID, e)
	}
}

// unregisterEndpoints takes every endpoint of rule out of the BPF load map.
func (g *Gateway) unregisterEndpoints(rule *config.Rule) {
	if g.slots == nil {
		return
	}
	for _, e := range rule.Endpoints {
		g.slots.remove(rule.ServiceID, e.Idx)
	}
}
