package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/config"
)

// servedFixture is a fixture whose API is served by Serve on a real loopback
// listener, so the server knows its own address.
func servedFixture(t *testing.T, apiHost string, opts Options) (*fixture, string) {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(apiHost, "0"))
	if err != nil {
		t.Skipf("cannot listen on %s: %v", apiHost, err)
	}
	opts.Settings, opts.Log = config.DefaultSettings(), quiet()
	f := &fixture{srv: New(opts)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = f.srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return")
		}
	})
	return f, ln.Addr().String()
}

func doURL(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func plainRule(vip string, port int, extraArgs string, eps ...string) string {
	return fmt.Sprintf(`{"serviceArguments":{"externalIP":%q,"port":%d,"protocol":"tcp","sel":0,"mode":4%s},"endpoints":[%s]}`,
		vip, port, extraArgs, strings.Join(eps, ","))
}

// TestRuleAddressChecks: a rule that would send traffic back into kvgate (its
// API, its own VIP, another rule's VIP, matched by ip:port with wildcard binds
// matching every local address) or to an address no engine has (unspecified,
// link-local, multicast, broadcast) is a 400 naming the field; a wildcard VIP
// needs wildcardVip: true. Each case was accepted before the checks.
func TestRuleAddressChecks(t *testing.T) {
	_, apiAddr := servedFixture(t, "127.0.0.1", Options{})
	base := "http://" + apiAddr
	apiHost, apiPortText, _ := net.SplitHostPort(apiAddr)
	var apiPort int
	fmt.Sscan(apiPortText, &apiPort)
	// Another rule whose VIP later rules must not point at.
	if code, body := doURL(t, "POST", base+lbPath, plainRule("127.0.0.9", 9009, "", epBody("10.0.0.5", 8000, 0, ""))); code != 200 {
		t.Fatalf("setup rule: %d %s", code, body)
	}
	cases := []struct {
		name, body, field, words string
	}{
		{"endpoint is the API", plainRule("10.0.0.1", 9000, "", epBody(apiHost, apiPort, 0, "")), "endpoints[0].endpointIP", "management API"},
		{"endpoint is the API via another loopback name", plainRule("10.0.0.1", 9000, "", epBody("10.0.0.5", 8000, 0, ""), epBody(apiHost, apiPort, 0, "")), "endpoints[1].endpointIP", "management API"},
		{"endpoint is its own VIP", plainRule("127.0.0.1", 9001, "", epBody("127.0.0.1", 9001, 0, "")), "endpoints[0].endpointIP", "own VIP"},
		{"endpoint is its own wildcard VIP", plainRule("0.0.0.0", 9002, `,"wildcardVip":true`, epBody("127.0.0.1", 9002, 0, "")), "endpoints[0].endpointIP", "own VIP"},
		{"endpoint is another rule's VIP", plainRule("10.0.0.1", 9000, "", epBody("127.0.0.9", 9009, 0, "")), "endpoints[0].endpointIP", "another kvgate rule"},
		{"wildcard VIP without opt-in", plainRule("0.0.0.0", 9003, "", epBody("10.0.0.5", 8000, 0, "")), "serviceArguments.externalIP", "wildcardVip"},
		{"IPv6 wildcard VIP without opt-in", plainRule("::", 9003, "", epBody("10.0.0.5", 8000, 0, "")), "serviceArguments.externalIP", "wildcardVip"},
		{"wildcardVip on a unicast VIP", plainRule("10.0.0.1", 9003, `,"wildcardVip":true`, epBody("10.0.0.5", 8000, 0, "")), "serviceArguments.wildcardVip", "0.0.0.0"},
		{"VIP on the API port", plainRule("0.0.0.0", apiPort, `,"wildcardVip":true`, epBody("10.0.0.5", 8000, 0, "")), "serviceArguments.externalIP", "management API"},
		{"multicast VIP", plainRule("239.1.1.1", 9003, "", epBody("10.0.0.5", 8000, 0, "")), "serviceArguments.externalIP", "multicast"},
		{"unspecified endpoint", plainRule("10.0.0.1", 9000, "", epBody("0.0.0.0", 8000, 0, "")), "endpoints[0].endpointIP", "unspecified"},
		{"IPv6 unspecified endpoint", plainRule("10.0.0.1", 9000, "", epBody("::", 8000, 0, "")), "endpoints[0].endpointIP", "unspecified"},
		{"link-local endpoint", plainRule("10.0.0.1", 9000, "", epBody("169.254.169.254", 80, 0, "")), "endpoints[0].endpointIP", "link-local"},
		{"IPv6 link-local endpoint", plainRule("10.0.0.1", 9000, "", epBody("fe80::1", 8000, 0, "")), "endpoints[0].endpointIP", "link-local"},
		{"multicast endpoint", plainRule("10.0.0.1", 9000, "", epBody("224.0.0.1", 8000, 0, "")), "endpoints[0].endpointIP", "multicast"},
		{"IPv6 multicast endpoint", plainRule("10.0.0.1", 9000, "", epBody("ff02::1", 8000, 0, "")), "endpoints[0].endpointIP", "multicast"},
		{"broadcast endpoint", plainRule("10.0.0.1", 9000, "", epBody("255.255.255.255", 8000, 0, "")), "endpoints[0].endpointIP", "broadcast"},
		{"IPv4-mapped own VIP", plainRule("127.0.0.1", 9001, "", epBody("::ffff:127.0.0.1", 9001, 0, "")), "endpoints[0].endpointIP", "own VIP"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, body := doURL(t, "POST", base+lbPath, c.body)
			if code != 400 {
				t.Fatalf("status %d %s", code, body)
			}
			var e errorBody
			if err := json.Unmarshal([]byte(body), &e); err != nil {
				t.Fatalf("body %s", body)
			}
			if !strings.HasPrefix(e.Message, c.field+":") || !strings.Contains(e.Message, c.words) {
				t.Errorf("message %q does not name %q with %q", e.Message, c.field, c.words)
			}
		})
	}
	// What stays allowed: a wildcard VIP with the opt-in, a loopback engine
	// on another port, the same port on another (non-local) address.
	for _, ok := range []string{
		plainRule("0.0.0.0", 9004, `,"wildcardVip":true`, epBody("127.0.0.1", 8000, 0, "")),
		plainRule("127.0.0.1", 9005, "", epBody("127.0.0.1", 9006, 0, ""), epBody("10.0.0.5", apiPort, 0, "")),
		plainRule("::1", 9007, "", epBody("2001:db8::1", 9007, 0, "")),
	} {
		if code, body := doURL(t, "POST", base+lbPath, ok); code != 200 {
			t.Errorf("%s: %d %s", ok, code, body)
		}
	}
	// An update is checked too, without counting the rule's own old VIP as "another rule".
	if code, body := doURL(t, "POST", base+lbPath, plainRule("127.0.0.9", 9009, "", epBody("10.0.0.6", 8000, 0, ""))); code != 200 {
		t.Errorf("update of the setup rule: %d %s", code, body)
	}
	if code, body := doURL(t, "PATCH", base+lbPath+"/externalipaddress/127.0.0.9/port/9009/protocol/tcp",
		`{"endpoints":[{"endpointIP":"127.0.0.9","targetPort":9009,"weight":1}]}`); code != 400 || !strings.Contains(body, "own VIP") {
		t.Errorf("PATCH pointing the rule at itself: %d %s", code, body)
	}
}

// TestWildcardAPIMatchesLocalAddresses: an API bound to 0.0.0.0 answers on
// every local address, so an endpoint on any of them with the API's port is
// refused, while a non-local address with that port is not.
func TestWildcardAPIMatchesLocalAddresses(t *testing.T) {
	local := func(a netip.Addr) bool { return a.IsLoopback() || a == netip.MustParseAddr("192.0.2.77") }
	_, apiAddr := servedFixture(t, "0.0.0.0", Options{HostAddrs: func() (func(netip.Addr) bool, func(netip.Addr) bool) {
		return local, func(a netip.Addr) bool { return a == netip.MustParseAddr("192.0.2.255") }
	}})
	_, portText, _ := net.SplitHostPort(apiAddr)
	var port int
	fmt.Sscan(portText, &port)
	base := "http://" + net.JoinHostPort("127.0.0.1", portText)
	for _, c := range []struct {
		ip    string
		port  int
		words string
	}{
		{"127.0.0.1", port, "management API"},
		{"127.3.4.5", port, "management API"},
		{"192.0.2.77", port, "management API"},
		{"192.0.2.255", 8000, "broadcast"},
		{"192.0.2.78", port, ""},
	} {
		code, body := doURL(t, "POST", base+lbPath, plainRule("10.0.0.1", 9000, "", epBody(c.ip, c.port, 0, "")))
		if c.words == "" {
			if code != 200 {
				t.Errorf("%s:%d: %d %s", c.ip, c.port, code, body)
			}
			continue
		}
		if code != 400 || !strings.Contains(body, "endpoints[0].endpointIP") || !strings.Contains(body, c.words) {
			t.Errorf("%s:%d: %d %s", c.ip, c.port, code, body)
		}
	}
}

// TestAllowedSourcesRefused: a source allow-list kvgate cannot enforce is a
// 400, not silently ignored (it used to be accepted and ignored); empty lists
// restrict nothing and stay accepted.
func TestAllowedSourcesRefused(t *testing.T) {
	f := newFixture(t, t.TempDir(), nil)
	rule := mode3Rule(epBody("10.0.1.1", 8000, 0, ""))
	for _, c := range []struct {
		name, body, field string
	}{
		{"top level", strings.Replace(rule, "{", `{"allowedSources":[{"prefix":"10.0.0.0/8"}],`, 1), "allowedSources"},
		{"in serviceArguments", strings.Replace(rule, `"serviceArguments":{`, `"serviceArguments":{"allowedSources":["10.0.0.0/8"],`, 1), "serviceArguments.allowedSources"},
		{"not a list", strings.Replace(rule, "{", `{"allowedSources":"10.0.0.0/8",`, 1), "allowedSources"},
	} {
		code, body := f.do(t, "POST", lbPath, c.body)
		if code != 400 || !strings.Contains(body, `"message":"`+c.field+":") || !strings.Contains(body, "not supported") {
			t.Errorf("%s: %d %s", c.name, code, body)
		}
	}
	for _, ok := range []string{
		strings.Replace(rule, "{", `{"allowedSources":[],`, 1),
		strings.Replace(rule, "{", `{"allowedSources":null,`, 1),
	} {
		if code, body := f.do(t, "POST", lbPath, ok); code != 200 {
			t.Errorf("%s: %d %s", ok, code, body)
		}
	}
	path := lbPath + "/externalipaddress/10.0.0.1/port/9000/protocol/tcp"
	if code, body := f.do(t, "PATCH", path, `{"allowedSources":[{"prefix":"10.0.0.0/8"}]}`); code != 400 || !strings.Contains(body, "allowedSources") {
		t.Errorf("PATCH: %d %s", code, body)
	}
}

// TestRuleNamePrintableASCII: a name with control characters, NUL, DEL or
// non-ASCII bytes is a 400 (it was accepted and reached logs and kvctl).
func TestRuleNamePrintableASCII(t *testing.T) {
	f := newFixture(t, t.TempDir(), nil)
	for _, c := range []struct {
		name string
		ok   bool
	}{
		{"gpu-pool A_1 (prod)", true},
		{strings.Repeat("n", 256), true},
		{strings.Repeat("n", 257), false},
		{"evil\nlevel=ERROR msg=forged", false},
		{"nul\x00byte", false},
		{"tab\there", false},
		{"del\x7f", false},
		{"caf\u00e9", false},
	} {
		nameJSON, _ := json.Marshal(c.name)
		body := strings.Replace(mode3Rule(epBody("10.0.1.1", 8000, 0, "")), `"serviceArguments":{`, `"serviceArguments":{"name":`+string(nameJSON)+`,`, 1)
		code, resp := f.do(t, "POST", lbPath, body)
		if c.ok != (code == 200) || (!c.ok && (code != 400 || !strings.Contains(resp, "serviceArguments.name"))) {
			t.Errorf("name %q: %d %s", c.name, code, resp)
		}
	}
}

type fakeReadiness struct {
	ready   bool
	pending []string
}

func (r *fakeReadiness) Ready() (bool, []string) { return r.ready, r.pending }

// TestReadyz: GET /readyz is 503 with the pending models while the daemon
// waits, 200 once ready, and 200 when no readiness source is wired.
func TestReadyz(t *testing.T) {
	rd := &fakeReadiness{pending: []string{"b/model", "Qwen/Qwen3-0.6B"}}
	for _, c := range []struct {
		opts   Options
		set    func()
		status int
		body   string
	}{
		{Options{Readiness: rd}, func() {}, 503, `{"ready":false,"pending":["Qwen/Qwen3-0.6B","b/model"]}`},
		{Options{Readiness: rd}, func() { rd.ready, rd.pending = true, nil }, 200, `{"ready":true,"pending":[]}`},
		{Options{}, func() {}, 200, `{"ready":true,"pending":[]}`},
	} {
		c.set()
		c.opts.Log = quiet()
		srv := New(c.opts)
		ts := newTestServer(t, srv.Handler())
		code, body := doURL(t, "GET", ts+"/readyz", "")
		if code != c.status || strings.TrimSpace(body) != c.body {
			t.Errorf("got %d %s, want %d %s", code, body, c.status, c.body)
		}
	}
}

func newTestServer(t *testing.T, h http.Handler) string {
	t.Helper()
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	return ts.URL
}

// TestRestoreSkipsRulesThatLoop: a saved rule that predates the address
// checks and points at its own VIP is kept (state is never lost) but not
// started; a legacy wildcard VIP without wildcardVip still starts.
func TestRestoreSkipsRulesThatLoop(t *testing.T) {
	sink := &recordingSink{}
	srv := New(Options{Settings: config.DefaultSettings(), Sink: sink, Log: quiet()})
	loop := config.Rule{ServiceID: 1, Args: config.ServiceArguments{ExternalIP: "127.0.0.1", Port: 9001, Mode: 4},
		Endpoints: []config.Endpoint{{IP: "127.0.0.1", TargetPort: 9001}}}
	legacy := config.Rule{ServiceID: 2, Args: config.ServiceArguments{ExternalIP: "0.0.0.0", Port: 9002, Mode: 4},
		Endpoints: []config.Endpoint{{IP: "10.0.0.5", TargetPort: 8000}}}
	if err := srv.Restore([]config.Rule{loop, legacy}); err != nil {
		t.Fatal(err)
	}
	if len(srv.Rules()) != 2 {
		t.Fatalf("restored %d rules, want both kept", len(srv.Rules()))
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if len(sink.changes) != 1 || sink.changes[0][1].ServiceID != 2 {
		t.Fatalf("started %v, want only the legacy wildcard rule", sink.changes)
	}
}

// TestEndpointCIDRsRefuse: with --endpoint-cidrs, an endpoint outside the
// ranges is a 400 naming it; one inside is accepted (no open relay).
func TestEndpointCIDRsRefuse(t *testing.T) {
	_, base := servedFixture(t, "127.0.0.1", Options{EndpointCIDRs: []netip.Prefix{netip.MustParsePrefix("127.88.0.0/16")}})
	url := "http://" + base + "/netlox/v1/config/loadbalancer"
	ep := func(ip string) string { return fmt.Sprintf(`{"endpointIP":%q,"targetPort":8000,"weight":1}`, ip) }
	tests := []struct {
		name, body string
		status     int
		want       string
	}{
		{"inside", plainRule("127.88.1.1", 18090, "", ep("127.88.2.2")), 200, ""},
		{"outside", plainRule("127.88.1.1", 18091, "", ep("127.88.2.2"), ep("127.99.0.1")), 400,
			"endpoints[1].endpointIP: 127.99.0.1 is outside the endpoint ranges this kvgate allows (--endpoint-cidrs 127.88.0.0/16)"},
	}
	for _, tc := range tests {
		status, body := doURL(t, "POST", url, tc.body)
		if status != tc.status || !strings.Contains(body, tc.want) {
			t.Errorf("%s: %d %s", tc.name, status, body)
		}
	}
}
