// Package api is kvgate's management HTTP API: LoxiLB's load-balancer REST
// paths (docs/api.md), the KV inventory endpoint and
// the Prometheus exposition.
//
// The API owns the rule table: it validates posted rules, allocates
// service_id and ep_idx, persists the table and tells the rest of the daemon
// about every change through RuleSink. It reads runtime facts (endpoint
// health, inventories) through small interfaces, so it runs and is tested on
// its own.
//
// Authentication, TLS and audit wrap the handler from outside
// (Options.Middleware, package apiauth); docs/security.md has the model.
package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/internal/recovery"
	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/status"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// DefaultAddr is the default --api listen address: loopback, where kvgate
// starts without TLS or tokens (beyond it, cmd/kvgate requires both).
const DefaultAddr = "127.0.0.1:11111"

// BasePath is LoxiLB's API prefix.
const BasePath = "/netlox/v1"

// Limits.
const (
	// MaxRules bounds the rule table.
	MaxRules = 4096
	// maxBody bounds a posted rule (256 endpoints take ~40 KiB).
	maxBody = 4 << 20
)

// RuleSink is told about every change to the rule table, after validation and
// before the change is persisted and answered. old is nil on create, updated
// is nil on delete; on update both are set and endpoints are matched by
// Endpoint.Key (ip:port) with stable Idx, so the daemon can keep the
// subscribers and inventories of endpoints that stay and start or stop the
// others. Admin changes (kvctl set endpoint) arrive as updates that differ
// only in Endpoint.AdminDown.
//
// An error on create or update rejects the change (the client gets a 500
// with the message, or a 409 for a *config.ConflictError, e.g. an address in
// use); the sink must leave its own state as it was. Errors on delete are
// logged and the rule is removed anyway. Calls are serialised; the sink must
// not call back into the API. The rules passed are copies the sink may keep.
type RuleSink interface {
	RuleChanged(old, updated *config.Rule) error
}

// Persister stores the whole rule table (package state implements it).
type Persister interface {
	Save(rules []config.Rule) error
}

// InventorySource snapshots one endpoint's KV inventory for
// GET /netlox/v1/config/ai/kv/inventory. algo is the effective hash algorithm
// ("" reads as sha256_cbor); ok is false when the endpoint has no inventory.
type InventorySource interface {
	Snapshot(serviceID, epIdx int) (algo string, hashes []uint64, ok bool)
}

// HealthSource reports whether an endpoint is healthy (probe up): a false
// answer shows as "state":"inactive" in GET. known false means no opinion.
type HealthSource interface {
	EndpointActive(serviceID, epIdx int) (active, known bool)
}

// RuleMetrics keeps per-rule metric series in step with the rule table
// (*metrics.Metrics implements it): InitRule pre-creates a new rule's series
// (the nine miss reasons at 0), DeleteRule and DeleteEndpoint drop the series
// of what went away, SetAdminDown mirrors the admin state.
type RuleMetrics interface {
	InitRule(serviceID int)
	DeleteRule(serviceID int)
	DeleteEndpoint(serviceID, epIdx int)
	SetAdminDown(serviceID, epIdx int, down bool)
}

// StatusSource builds the fleet view (*status.Collector implements it).
type StatusSource interface {
	Snapshot() status.Status
}

// Options configure a Server. Every interface may be nil.
type Options struct {
	// Settings are the process settings (the hash seed matters to validation).
	Settings  config.Settings
	Sink      RuleSink
	Store     Persister
	Inventory InventorySource
	Health    HealthSource
	Metrics   RuleMetrics
	// Gatherer is served on /netlox/v1/metrics and /metrics.
	Gatherer prometheus.Gatherer
	// Status builds the fleet view of GET /netlox/v1/status and the page at
	// GET / (package status); nil answers 503.
	Status StatusSource
	// EndpointCIDRs, when set, are the only ranges rule endpoints may be in
	// (--endpoint-cidrs).
	EndpointCIDRs []netip.Prefix
	// BackendTokenDir, when set, is the only directory a rule's
	// backendTokenFile may be in (--backend-token-dir); "" allows any path.
	BackendTokenDir string
	// Middleware wraps the whole API handler when serving: authentication
	// and audit (package apiauth). nil serves it bare.
	Middleware func(http.Handler) http.Handler
	// Readiness answers GET /readyz; nil means always ready.
	Readiness Readiness
	// Preflight runs POST /netlox/v1/config/ai/kv/preflight; nil answers 503.
	Preflight PreflightRunner
	// HostAddrs reports the host's local and broadcast addresses for the
	// address checks (config.CheckAddresses); nil means config.HostAddrs.
	HostAddrs func() (local, broadcast func(netip.Addr) bool)
	Log       *slog.Logger
	// Guard recovers and counts a panic in one API request; nil still recovers.
	Guard *recovery.Guard
}

// Readiness reports whether the daemon is ready for traffic and, if not,
// what it still waits for (the staged tokenizers still loading).
type Readiness interface {
	Ready() (ready bool, pending []string)
}

// Server is the management API and the owner of the rule table.
type Server struct {
	opts Options
	log  *slog.Logger

	mu    sync.Mutex
	rules map[config.RuleKey]*config.Rule
	// preflightBusy lets one preflight run at a time: each sends probe
	// requests and scrapes every engine.
	preflightBusy atomic.Bool
	// apiAddr is where Serve listens, so a rule cannot point back at the API.
	apiAddr netip.AddrPort

	openAPIOnce sync.Once
	openAPI     []byte
	openAPIErr  error
}

// New returns a server with an empty rule table.
func New(opts Options) *Server {
	log := opts.Log
	if log == nil {
		log = slog.Default()
	}
	return &Server{opts: opts, log: log, rules: map[config.RuleKey]*config.Rule{}}
}

// Restore loads rules saved by an earlier run and tells the sink about each,
// as creates. A rule the sink cannot start is kept (so state is never lost by
// a restart) and the error is logged; restored rules are not re-validated
// against today's environment, only checked for a usable identity.
func (s *Server) Restore(rules []config.Rule) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	usedIDs := map[int]bool{}
	for i := range rules {
		r := rules[i].Clone()
		k := r.Key()
		if _, dup := s.rules[k]; dup || r.ServiceID < 1 || usedIDs[r.ServiceID] {
			return fmt.Errorf("restore: rule %s (service_id %d) is a duplicate or has no service_id", k, r.ServiceID)
		}
		if len(r.Endpoints) > config.MaxEndpoints {
			return fmt.Errorf("restore: rule %s has %d endpoints", k, len(r.Endpoints))
		}
		usedIDs[r.ServiceID] = true
		s.rules[k] = r
	}
	for _, r := range s.sortedLocked() {
		s.metricsChanged(nil, r)
		if err := s.restoreCheckLocked(r); err != nil {
			s.log.Error("restored rule fails the address checks; it is kept but not started: fix it with PATCH or delete it",
				"rule", r.Key().String(), "service_id", r.ServiceID, "err", err)
			continue
		}
		if s.opts.Sink != nil {
			if err := s.opts.Sink.RuleChanged(nil, r.Clone()); err != nil {
				s.log.Error("restored rule could not be started; it is kept", "rule", r.Key().String(), "service_id", r.ServiceID, "err", err)
			}
		}
	}
	return nil
}

// restoreCheckLocked applies the address checks to a restored rule, which
// may predate them: a rule that would loop into kvgate or reach no engine is
// not started. A wildcard VIP saved before wildcardVip existed was the
// operator's choice then and still starts.
func (s *Server) restoreCheckLocked(r *config.Rule) error {
	c := r.Clone()
	if config.WildcardVIP(c.Args.ExternalIP) {
		c.Args.WildcardVIP = true
	}
	if err := config.CheckAddresses(c, s.listenersLocked(c.Key())); err != nil {
		return err
	}
	if c.Args.BackendTokenFile != "" {
		if err := inBackendTokenDir(c.Args.BackendTokenFile, s.opts.BackendTokenDir); err != nil {
			return err
		}
	}
	return config.CheckEndpointCIDRs(c, s.opts.EndpointCIDRs)
}

// Rules returns copies of the rules, ordered by service_id.
func (s *Server) Rules() []*config.Rule {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.sortedLocked()
	for i := range out {
		out[i] = out[i].Clone()
	}
	return out
}

// RuleByID returns a copy of the rule with that service_id.
func (s *Server) RuleByID(serviceID int) (*config.Rule, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.rules {
		if r.ServiceID == serviceID {
			return r.Clone(), true
		}
	}
	return nil, false
}

func (s *Server) sortedLocked() []*config.Rule {
	out := make([]*config.Rule, 0, len(s.rules))
	for _, r := range s.rules {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ServiceID < out[j].ServiceID })
	return out
}

func (s *Server) snapshotLocked() []config.Rule {
	rs := s.sortedLocked()
	out := make([]config.Rule, len(rs))
	for i, r := range rs {
		out[i] = *r.Clone()
	}
	return out
}

// nextServiceIDLocked is the lowest unused service_id, from 1.
func (s *Server) nextServiceIDLocked() int {
	used := make(map[int]bool, len(s.rules))
	for _, r := range s.rules {
		used[r.ServiceID] = true
	}
	id := 1
	for used[id] {
		id++
	}
	return id
}

// apiError carries an HTTP status with the message for the client.
type apiError struct {
	status int
	msg    string
}

func (e *apiError) Error() string { return e.msg }

func statusOf(err error) (int, string) {
	var ae *apiError
	var ve *config.ValidationError
	var ce *config.ConflictError
	switch {
	case errors.As(err, &ae):
		return ae.status, ae.msg
	case errors.As(err, &ve):
		return http.StatusBadRequest, ve.Msg
	case errors.As(err, &ce):
		return http.StatusConflict, ce.Msg
	}
	return http.StatusInternalServerError, err.Error()
}

// Apply creates or updates a rule, as POST does, and returns its service_id.
// posted is not modified. adminGiven reports whether posted endpoint i carried
// an admin field; on an update an endpoint without one keeps its admin state,
// so re-posting a LoxiLB script does not bring a drained endpoint back. A nil
// adminGiven means every admin field was given.
func (s *Server) Apply(posted *config.Rule, adminGiven func(i int) bool) (int, error) {
	r := posted.Clone()
	if err := config.Validate(r, s.opts.Settings); err != nil {
		return 0, err
	}
	if err := s.checkBackendTokenFile(r); err != nil {
		return 0, err
	}
	r.Args.ExternalIP = r.Key().ExternalIP
	r.Args.Protocol = r.Key().Protocol
	for i := range r.Endpoints {
		if ip := net.ParseIP(r.Endpoints[i].IP); ip != nil {
			r.Endpoints[i].IP = ip.String()
		}
	}
	r.Owner = "" // a REST rule; only ReconcileFile installs owned rules
	s.mu.Lock()
	defer s.mu.Unlock()
	key := r.Key()
	if err := s.ownedLocked(key); err != nil {
		return 0, err
	}
	if err := config.CheckAddresses(r, s.listenersLocked(key)); err != nil {
		return 0, err
	}
	if err := config.CheckEndpointCIDRs(r, s.opts.EndpointCIDRs); err != nil {
		return 0, err
	}
	old := s.rules[key]
	if old != nil {
		if err := config.CheckUpdate(old, r); err != nil {
			return 0, err
		}
		r.ServiceID = old.ServiceID
		r.AssignIndices(old)
		keepAdminState(r, old, adminGiven)
	} else {
		if len(s.rules) >= MaxRules {
			return 0, &apiError{http.StatusBadRequest, fmt.Sprintf("rule table full: at most %d rules", MaxRules)}
		}
		r.ServiceID = s.nextServiceIDLocked()
		r.AssignIndices(nil)
	}
	if err := s.commitLocked(key, old, r); err != nil {
		return 0, err
	}
	return r.ServiceID, nil
}

// keepAdminState copies old's admin state onto every endpoint of r that was
// posted without an admin field (adminGiven(i) false; nil: all were given).
func keepAdminState(r, old *config.Rule, adminGiven func(i int) bool) {
	if adminGiven == nil {
		return
	}
	for i := range r.Endpoints {
		if adminGiven(i) {
			continue
		}
		if prev, ok := old.EndpointByKey(r.Endpoints[i].Key()); ok {
			r.Endpoints[i].AdminDown = prev.AdminDown
		}
	}
}

// listenersLocked describes kvgate's own listeners for the address checks of
// the rule under key: the API and every other rule's VIP.
func (s *Server) listenersLocked(key config.RuleKey) config.Listeners {
	hostAddrs := s.opts.HostAddrs
	if hostAddrs == nil {
		hostAddrs = config.HostAddrs
	}
	l := config.Listeners{API: s.apiAddr}
	l.Local, l.Broadcast = hostAddrs()
	for k, r := range s.rules {
		if k == key {
			continue
		}
		if a, err := netip.ParseAddr(k.ExternalIP); err == nil {
			l.VIPs = append(l.VIPs, netip.AddrPortFrom(a.Unmap(), uint16(r.Args.Port)))
		}
	}
	return l
}

// commitLocked tells the sink, persists, and installs updated (nil deletes).
// old is the rule installed under key now (nil: none).
func (s *Server) commitLocked(key config.RuleKey, old, updated *config.Rule) error {
	if err := s.tellSinkLocked(key, old, updated); err != nil {
		return err
	}
	s.installLocked(key, updated)
	if err := s.saveLocked(key, old, updated); err != nil {
		return err
	}
	s.metricsChanged(old, updated)
	return nil
}

// tellSinkLocked hands the change old → updated to the sink, if any. A
// teardown (updated nil) that the sink reports as failed is only logged: the
// rule goes anyway.
func (s *Server) tellSinkLocked(key config.RuleKey, old, updated *config.Rule) error {
	if s.opts.Sink == nil {
		return nil
	}
	err := s.opts.Sink.RuleChanged(cloneRule(old), cloneRule(updated))
	if err == nil {
		return nil
	}
	if updated == nil {
		s.log.Error("rule teardown reported an error; the rule is removed", "rule", key.String(), "err", err)
		return nil
	}
	var ce *config.ConflictError
	var ve *config.ValidationError // a rule the daemon cannot start as given (a TLS rule's missing files)
	if errors.As(err, &ce) || errors.As(err, &ve) {
		return err
	}
	return &apiError{http.StatusInternalServerError, fmt.Sprintf("rule %s not applied: %v", key, err)}
}

// saveLocked persists the installed rules, if there is a store. When the save
// fails it undoes the change in memory and in the daemon: the API never
// answers success for a change that would be lost at restart.
func (s *Server) saveLocked(key config.RuleKey, old, updated *config.Rule) error {
	if s.opts.Store == nil {
		return nil
	}
	err := s.opts.Store.Save(s.snapshotLocked())
	if err == nil {
		return nil
	}
	s.installLocked(key, old)
	if s.opts.Sink != nil {
		if rerr := s.opts.Sink.RuleChanged(cloneRule(updated), cloneRule(old)); rerr != nil {
			s.log.Error("could not revert the daemon after a failed save", "rule", key.String(), "err", rerr)
		}
	}
	return &apiError{http.StatusInternalServerError, fmt.Sprintf("rule %s not saved: %v", key, err)}
}

// installLocked puts r under key; nil removes the rule.
func (s *Server) installLocked(key config.RuleKey, r *config.Rule) {
	if r == nil {
		delete(s.rules, key)
	} else {
		s.rules[key] = r
	}
}

// cloneRule is r.Clone(), nil for nil: the sink gets copies it may keep.
func cloneRule(r *config.Rule) *config.Rule {
	if r == nil {
		return nil
	}
	return r.Clone()
}

// metricsChanged creates and deletes per-rule series for a committed change.
func (s *Server) metricsChanged(old, updated *config.Rule) {
	m := s.opts.Metrics
	if m == nil {
		return
	}
	switch {
	case updated == nil:
		m.DeleteRule(old.ServiceID)
		return
	case old == nil:
		m.InitRule(updated.ServiceID)
	default:
		for _, e := range config.DiffEndpoints(old, updated).Removed {
			m.DeleteEndpoint(old.ServiceID, e.Idx)
		}
	}
	for _, e := range updated.Endpoints {
		m.SetAdminDown(updated.ServiceID, e.Idx, e.AdminDown)
	}
}

// Delete removes one rule.
func (s *Server) Delete(key config.RuleKey) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, ok := s.rules[key]
	if !ok {
		return ruleNotFound(key)
	}
	if err := s.ownedLocked(key); err != nil {
		return err
	}
	return s.commitLocked(key, old, nil)
}

// DeleteAll removes every rule.
func (s *Server) DeleteAll() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	// All or nothing: a table that holds file-owned rules is refused before
	// any rule goes.
	for _, r := range s.sortedLocked() {
		if err := s.ownedLocked(r.Key()); err != nil {
			return err
		}
	}
	for _, r := range s.sortedLocked() {
		if err := s.commitLocked(r.Key(), r, nil); err != nil {
			return err
		}
	}
	return nil
}

// SetAdmin sets one endpoint administratively down or up.
func (s *Server) SetAdmin(key config.RuleKey, epKey string, down bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, ok := s.rules[key]
	if !ok {
		return ruleNotFound(key)
	}
	if err := s.ownedLocked(key); err != nil {
		return err
	}
	updated := old.Clone()
	found := false
	for i := range updated.Endpoints {
		if updated.Endpoints[i].Key() == epKey {
			updated.Endpoints[i].AdminDown = down
			found = true
		}
	}
	if !found {
		return &apiError{http.StatusNotFound, fmt.Sprintf("endpoint %s not found in rule %s", epKey, key)}
	}
	return s.commitLocked(key, old, updated)
}

// Serve serves the API on ln until ctx ends, then shuts down gracefully
// (bounded by 5 s).
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	if ap, err := netip.ParseAddrPort(ln.Addr().String()); err == nil {
		s.mu.Lock()
		s.apiAddr = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
		s.mu.Unlock()
	}
	var h http.Handler = s.Handler()
	if s.opts.Middleware != nil {
		h = s.opts.Middleware(h)
	}
	srv := &http.Server{
		Handler:           s.opts.Guard.Handler(recovery.API, h),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      5 * time.Minute, // a large inventory takes a while to stream
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
	}
	errc := make(chan error, 1)
	s.opts.Guard.Go(recovery.API, func() { errc <- srv.Serve(ln) })
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-errc
		return nil
	}
}

// Route is one method and path pattern the API serves (net/http ServeMux
// syntax). docs/openapi.yaml documents exactly these; tests/openapi diffs the
// two.
type Route struct {
	Method, Pattern string
}

type route struct {
	Route
	handler http.Handler
	// anyMethod registers the pattern for every method: the handler answers
	// other methods itself, in the reference's own shape.
	anyMethod bool
}

func (s *Server) routeTable() []route {
	lb := BasePath + "/config/loadbalancer"
	byKey := lb + "/externalipaddress/{ip}/port/{port}/protocol/{proto}"
	var metrics http.Handler = http.NotFoundHandler()
	if s.opts.Gatherer != nil {
		metrics = promhttp.HandlerFor(s.opts.Gatherer, promhttp.HandlerOpts{ErrorLog: slogPromLogger{s.log}})
	}
	f := func(method, pattern string, h http.HandlerFunc) route {
		return route{Route: Route{method, pattern}, handler: h}
	}
	return []route{
		f("POST", lb, s.handlePost),
		f("GET", lb+"/all", s.handleList),
		f("DELETE", lb+"/all", s.handleDeleteAll),
		f("GET", byKey, s.handleGet),
		f("DELETE", byKey, s.handleDelete),
		f("PATCH", byKey, s.handlePatch),
		f("PUT", byKey+"/endpoint", s.handleSetEndpoint),
		f("GET", lb+"/id/{id}", s.handleGetByID),
		f("DELETE", lb+"/name/{name}", s.handleDeleteByName),
		{Route: Route{"GET", BasePath + "/config/ai/kv/inventory"}, handler: http.HandlerFunc(s.handleInventory), anyMethod: true},
		f("POST", BasePath+"/config/ai/kv/preflight", s.handlePreflight),
		{Route: Route{"GET", BasePath + "/metrics"}, handler: metrics},
		{Route: Route{"GET", "/metrics"}, handler: metrics},
		f("GET", BasePath+"/openapi.json", s.handleOpenAPI),
		f("GET", BasePath+"/status", s.handleStatus),
		f("GET", "/{$}", s.handleStatusPage),
		f("GET", "/healthz", s.handleHealthz),
		f("GET", "/readyz", s.handleReadyz),
	}
}

// Routes lists every method and path the API serves.
func Routes() []Route {
	var s Server
	table := s.routeTable()
	out := make([]Route, len(table))
	for i, r := range table {
		out[i] = r.Route
	}
	return out
}

// Handler is the API's HTTP handler.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	for _, r := range s.routeTable() {
		if r.anyMethod {
			mux.Handle(r.Pattern, r.handler)
		} else {
			mux.Handle(r.Method+" "+r.Pattern, r.handler)
		}
	}
	return mux
}

type slogPromLogger struct{ l *slog.Logger }

func (p slogPromLogger) Println(v ...any) { p.l.Error("metrics exposition", "err", fmt.Sprint(v...)) }
