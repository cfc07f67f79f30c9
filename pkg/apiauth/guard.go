package apiauth

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Observer counts what the guard does; *metrics.Metrics adapts to it.
type Observer interface {
	// AuthFailure counts a refused request: reason is missing, invalid or
	// forbidden.
	AuthFailure(reason string)
	// Reload counts a reload of a watched file (what: tokens, certificate,
	// client-ca).
	Reload(what string, ok bool)
}

type nopObserver struct{}

func (nopObserver) AuthFailure(string)  {}
func (nopObserver) Reload(string, bool) {}

// GuardOptions configure a Guard.
type GuardOptions struct {
	// TokenFile enables bearer tokens; "" lets every request through (the
	// API is then unauthenticated: loopback only, or --api-insecure).
	TokenFile string
	// Open lists the paths served without a token (probes).
	Open []string
	// ReloadInterval between file checks; 0 means DefaultReloadInterval.
	ReloadInterval time.Duration
	Observer       Observer
	// Log gets the audit lines and reload errors.
	Log *slog.Logger
}

// Guard authenticates and audits the management API.
type Guard struct {
	opts   GuardOptions
	tokens *watched[*Tokens]
	open   map[string]bool
}

// NewGuard loads the token file (if any). The caller runs Run to follow changes.
func NewGuard(opts GuardOptions) (*Guard, error) {
	if opts.Observer == nil {
		opts.Observer = nopObserver{}
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.ReloadInterval <= 0 {
		opts.ReloadInterval = DefaultReloadInterval
	}
	g := &Guard{opts: opts, open: map[string]bool{}}
	for _, p := range opts.Open {
		g.open[p] = true
	}
	if opts.TokenFile != "" {
		w, err := newWatched("tokens", []string{opts.TokenFile}, func() (*Tokens, error) { return LoadTokenFile(opts.TokenFile) },
			opts.Observer, opts.Log)
		if err != nil {
			return nil, err
		}
		g.tokens = w
	}
	return g, nil
}

// Enabled reports whether requests need a token.
func (g *Guard) Enabled() bool { return g.tokens != nil }

// Run follows the token file until ctx ends.
func (g *Guard) Run(ctx context.Context) {
	if g.tokens != nil {
		g.tokens.run(ctx, g.opts.ReloadInterval)
	}
}

// Reload checks the token file now (tests; Run does it on its own).
func (g *Guard) Reload() {
	if g.tokens != nil {
		g.tokens.check()
	}
}

type identityKey struct{}

// IdentityFrom is the identity a request authenticated as, if any.
func IdentityFrom(ctx context.Context) (Identity, bool) {
	id, ok := ctx.Value(identityKey{}).(Identity)
	return id, ok
}

func mutating(method string) bool {
	return method != http.MethodGet && method != http.MethodHead && method != http.MethodOptions
}

// Wrap guards next: a request needs "Authorization: Bearer <token>" unless its
// path is open; a read token may only read. Every mutating call is audited.
func (g *Guard) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := Identity{Name: "-"}
		if g.tokens != nil && !g.open[r.URL.Path] {
			token, ok := bearer(r.Header.Get("Authorization"))
			if !ok {
				g.refuse(w, r, http.StatusUnauthorized, "missing", "authentication required: send Authorization: Bearer <token>")
				return
			}
			found, ok := g.tokens.get().Lookup(token)
			if !ok {
				g.refuse(w, r, http.StatusUnauthorized, "invalid", "the bearer token is not valid")
				return
			}
			if found.Role != RoleAdmin && mutating(r.Method) {
				g.refuse(w, r, http.StatusForbidden, "forbidden", "token "+found.Name+" has role "+found.Role.String()+"; "+r.Method+" needs admin")
				return
			}
			id = found
			r = r.WithContext(context.WithValue(r.Context(), identityKey{}, id))
		}
		if !mutating(r.Method) {
			next.ServeHTTP(w, r)
			return
		}
		key := ruleKeyOf(r)
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(rec, r)
		g.opts.Log.Info("audit", "token", id.Name, "remote", r.RemoteAddr, "method", r.Method, "path", r.URL.Path,
			"rule", key, "status", rec.status, "result", result(rec.status))
	})
}

func result(status int) string {
	if status < 400 {
		return "ok"
	}
	return "refused"
}

func (g *Guard) refuse(w http.ResponseWriter, r *http.Request, status int, reason, msg string) {
	g.opts.Observer.AuthFailure(reason)
	if mutating(r.Method) {
		g.opts.Log.Info("audit", "token", "-", "remote", r.RemoteAddr, "method", r.Method, "path", r.URL.Path,
			"rule", ruleKeyOf(r), "status", status, "result", "unauthorized")
	}
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="kvgate"`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{status, msg})
}

func bearer(h string) (string, bool) {
	scheme, token, ok := strings.Cut(strings.TrimSpace(h), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

// ruleKeyOf names the rule a call is about, for the audit line: from the
// path (…/externalipaddress/IP/port/P/protocol/X, …/id/N, …/name/N), or
// from a posted rule's serviceArguments. It reads at most 4 MiB of body and
// puts the bytes back for the handler.
func ruleKeyOf(r *http.Request) string {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	for i := 0; i+1 < len(parts); i++ {
		switch parts[i] {
		case "externalipaddress":
			if i+5 < len(parts) {
				return parts[i+1] + ":" + parts[i+3] + "/" + parts[i+5]
			}
		case "id", "name":
			if parts[i-1] == "loadbalancer" {
				return parts[i] + "=" + parts[i+1]
			}
		}
	}
	if r.Method != http.MethodPost || r.Body == nil {
		return ""
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, 4<<20))
	r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(b), r.Body))
	if err != nil {
		return ""
	}
	var rule struct {
		Args struct {
			IP       string `json:"externalIP"`
			Port     int    `json:"port"`
			Protocol string `json:"protocol"`
		} `json:"serviceArguments"`
	}
	if json.Unmarshal(b, &rule) != nil || rule.Args.IP == "" {
		return ""
	}
	proto := rule.Args.Protocol
	if proto == "" {
		proto = "tcp"
	}
	return rule.Args.IP + ":" + strconv.Itoa(rule.Args.Port) + "/" + proto
}

type statusRecorder struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (s *statusRecorder) WriteHeader(code int) {
	if !s.wrote {
		s.status, s.wrote = code, true
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	s.wrote = true
	return s.ResponseWriter.Write(b)
}

// Flush lets streamed answers (the inventory) through the recorder.
func (s *statusRecorder) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}
