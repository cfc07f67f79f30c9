package api

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/preflight"
)

// recordingPreflight answers a fixed report and records how it was asked.
type recordingPreflight struct {
	mu     sync.Mutex
	calls  int
	probe  bool
	served int
}

func (p *recordingPreflight) Preflight(_ context.Context, rule *config.Rule, probe bool) preflight.Report {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls, p.probe, p.served = p.calls+1, probe, rule.ServiceID
	return preflight.Report{Result: preflight.Fail, Checks: []preflight.Check{{ID: preflight.CheckParity, EPIdx: 0, Result: preflight.Fail,
		Detail: "d", Fix: "engine 10.0.0.2 hashes with PYTHONHASHSEED=1; kvgate has LLB_KV_NONE_HASH_SEED=0"}}}
}

func TestPreflightRoute(t *testing.T) {
	f := newFixture(t, t.TempDir(), nil)
	if code, body := f.do(t, "POST", "/netlox/v1/config/ai/kv/preflight?service_id=1", ""); code != 503 || !strings.Contains(body, "not wired") {
		t.Fatalf("unwired: %d %s", code, body)
	}
	pf := &recordingPreflight{}
	f.srv.opts.Preflight = pf
	if code, body := f.do(t, "POST", lbPath, specBody(t)); code != 200 {
		t.Fatalf("create KV rule: %d %s", code, body)
	}
	plain := `{"serviceArguments":{"externalIP":"127.77.0.11","port":18081,"protocol":"tcp","sel":0,"mode":4},"endpoints":[{"endpointIP":"127.77.0.3","targetPort":18000,"weight":1}]}`
	if code, body := f.do(t, "POST", lbPath, plain); code != 200 {
		t.Fatalf("create plain rule: %d %s", code, body)
	}
	cases := []struct {
		name, method, query string
		code                int
		body                string
		probe               bool
	}{
		{"probe by default", "POST", "service_id=1", 200, `"result":"fail"`, true},
		{"probe=0", "POST", "service_id=1&probe=0", 200, "PYTHONHASHSEED=1", false},
		{"bad service_id", "POST", "service_id=x", 400, "invalid service_id", false},
		{"missing service_id", "POST", "", 400, "invalid service_id", false},
		{"bad probe", "POST", "service_id=1&probe=2", 400, "invalid probe", false},
		{"no such rule", "POST", "service_id=999", 404, "no rule with service_id 999", false},
		{"not a KV rule", "POST", "service_id=2", 400, "not a KV rule", false},
		{"GET", "GET", "service_id=1", 405, "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pf.mu.Lock()
			before := pf.calls
			pf.mu.Unlock()
			code, body := f.do(t, tc.method, "/netlox/v1/config/ai/kv/preflight?"+tc.query, "")
			if code != tc.code || !strings.Contains(body, tc.body) {
				t.Fatalf("%d %s, want %d with %q", code, body, tc.code, tc.body)
			}
			pf.mu.Lock()
			defer pf.mu.Unlock()
			ran := pf.calls > before
			if ran != (tc.code == 200) || (ran && (pf.probe != tc.probe || pf.served != 1)) {
				t.Fatalf("runner ran=%v probe=%v service=%d", ran, pf.probe, pf.served)
			}
		})
	}
}
