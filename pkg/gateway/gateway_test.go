package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testnet"
	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/fullproxy"
	"github.com/kvgate/kvgate/pkg/selector"
)

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestSelectorOptionsFromSettings(t *testing.T) {
	s := config.DefaultSettings()
	o, err := selectorOptions(s)
	if err != nil {
		t.Fatal(err)
	}
	if o.LBMode != selector.LBHard || o.Score != selector.ScorePrefix || o.MinMatchTokens != 16 || o.MeanLoadFactor != 175 {
		t.Fatalf("defaults mapped to %+v", o)
	}
	s.LBMode, s.Score, s.SpillRelief, s.MinMatchTokens = selector.LBOff, selector.ScoreOverlap, selector.ReliefOn, 0
	o, err = selectorOptions(s)
	if err != nil {
		t.Fatal(err)
	}
	if o.LBMode != selector.LBOff || o.Score != selector.ScoreOverlap || o.SpillRelief != selector.ReliefOn || o.MinMatchTokens != 0 {
		t.Fatalf("settings mapped to %+v", o)
	}
}

func TestDatapathChoice(t *testing.T) {
	for _, tc := range []struct {
		path string
		ok   bool
	}{{"", true}, {"auto", true}, {"userspace", true}, {"bogus", false}} {
		g, err := New(Options{Settings: config.DefaultSettings(), Datapath: tc.path, Logger: quietLogger()})
		if (err == nil) != tc.ok {
			t.Fatalf("--datapath=%q: err %v", tc.path, err)
		}
		if g != nil {
			g.Shutdown()
		}
	}
}

// freeAddr is 127.0.0.1 and a port nothing listens on.
func freeAddr(t *testing.T) (string, int) {
	t.Helper()
	return "127.0.0.1", testnet.Port(t, "127.0.0.1")
}

func mustRule(t *testing.T, body string) *config.Rule {
	t.Helper()
	var r config.Rule
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatal(err)
	}
	return &r
}

// TestRuleLifecycle: a rule's listener starts on create, follows endpoint
// changes on update and stops on delete; a request with no reachable
// endpoint gets kvgate's own error shape.
func TestRuleLifecycle(t *testing.T) {
	settings := config.DefaultSettings()
	settings.NoneHashSeed, settings.NoneHashSeedSet = "0", true
	g, err := New(Options{Settings: settings, TokenizerDir: t.TempDir(), Logger: quietLogger(), ShutdownGrace: time.Second,
		Limits: limitsForTest()})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Shutdown()
	vip, port := freeAddr(t)
	_, dead1 := freeAddr(t)
	_, dead2 := freeAddr(t)
	body := func(ports ...int) string {
		var eps []string
		for _, p := range ports {
			eps = append(eps, fmt.Sprintf(`{"endpointIP":"127.0.0.1","targetPort":%d,"weight":1}`, p))
		}
		return fmt.Sprintf(`{"serviceArguments":{"externalIP":%q,"port":%d,"protocol":"tcp","mode":4,"sel":0,"kvExactMode":3,"kvZmqPort":1,"kvBlockSize":16},"endpoints":[%s]}`,
			vip, port, strings.Join(eps, ","))
	}
	id, err := g.API.Apply(mustRule(t, body(dead1, dead2)), nil)
	if err != nil {
		t.Fatal(err)
	}
	addr, ok := g.ProxyAddr(id)
	if !ok {
		t.Fatal("no listener after create")
	}
	resp, err := http.Post("http://"+addr.String()+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 502 || !strings.Contains(string(b), `"error":"backend_unreachable"`) {
		t.Fatalf("dead endpoints: %d %s", resp.StatusCode, b)
	}
	if l, _ := g.Loads(id); l.Total() != 0 {
		t.Fatalf("in-flight %d at rest", l.Total())
	}

	if _, err := g.API.Apply(mustRule(t, body(dead2)), nil); err != nil {
		t.Fatalf("update: %v", err)
	}
	g.mu.Lock()
	n := len(g.rules[id].rule.Endpoints)
	g.mu.Unlock()
	if n != 1 {
		t.Fatalf("after update the gateway holds %d endpoints, want 1", n)
	}

	if err := g.API.DeleteAll(); err != nil {
		t.Fatal(err)
	}
	if _, ok := g.ProxyAddr(id); ok {
		t.Fatal("listener kept after delete")
	}
	time.Sleep(100 * time.Millisecond)
	if c, err := net.DialTimeout("tcp", addr.String(), 200*time.Millisecond); err == nil {
		c.Close()
		t.Fatal("still accepting after delete")
	}
}

func limitsForTest() (l fullproxy.Limits) {
	l.ConnectTimeout = 500 * time.Millisecond
	return l
}

// TestProbeStateShowsInAPI: an endpoint the active probe marks down reads
// "state":"inactive" in GET /netlox/v1/config/loadbalancer/all.
func TestProbeStateShowsInAPI(t *testing.T) {
	g, err := New(Options{Settings: config.DefaultSettings(), TokenizerDir: t.TempDir(), Logger: quietLogger(), ShutdownGrace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Shutdown()
	vip, port := freeAddr(t)
	_, dead := freeAddr(t)
	body := fmt.Sprintf(`{"serviceArguments":{"externalIP":%q,"port":%d,"protocol":"tcp","mode":4,"sel":0,"probetype":"tcp","probeRetries":1,"probeInterval":1},"endpoints":[{"endpointIP":"127.0.0.1","targetPort":%d,"weight":1}]}`, vip, port, dead)
	if _, err := g.API.Apply(mustRule(t, body), nil); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(8 * time.Second)
	for {
		rec := httptest.NewRecorder()
		g.API.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/netlox/v1/config/loadbalancer/all", nil))
		if strings.Contains(rec.Body.String(), `"state":"inactive"`) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("probe-down endpoint still shown as %s", rec.Body.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}
