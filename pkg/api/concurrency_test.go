package api

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/pkg/config"
)

func TestConcurrentRuleChanges(t *testing.T) {
	dir := t.TempDir()
	f := newFixture(t, dir, nil)
	const n = 24
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			body := strings.Replace(mode3Rule(epBody("10.0.1.1", 8000, 0, ""), epBody(fmt.Sprintf("10.0.2.%d", i+1), 8000, 0, "")), `"port":9000`, fmt.Sprintf(`"port":%d`, 9100+i), 1)
			if code, resp := f.do(t, "POST", lbPath, body); code != 200 {
				t.Errorf("post %d: %d %s", i, code, resp)
			}
			if i%3 == 0 {
				if code, resp := f.do(t, "DELETE", fmt.Sprintf("%s/externalipaddress/10.0.0.1/port/%d/protocol/tcp", lbPath, 9100+i), ""); code != 200 {
					t.Errorf("delete %d: %d %s", i, code, resp)
				}
			}
			f.do(t, "GET", lbPath+"/all", "")
		}(i)
	}
	wg.Wait()
	rules := f.srv.Rules()
	if len(rules) != n-n/3 {
		t.Fatalf("%d rules, want %d", len(rules), n-n/3)
	}
	ids := map[int]bool{}
	for _, r := range rules {
		if ids[r.ServiceID] {
			t.Fatalf("service_id %d given twice", r.ServiceID)
		}
		ids[r.ServiceID] = true
	}
	saved, err := f.store.Load()
	if err != nil || len(saved) != len(rules) {
		t.Fatalf("persisted %d rules (%v), want %d", len(saved), err, len(rules))
	}
}

// FuzzPost: any body gets a 200 or a 4xx JSON error, never a panic or a 500.
func FuzzPost(f *testing.F) {
	if b, err := os.ReadFile("testdata/spec_8_1.json"); err == nil {
		f.Add(b)
	}
	f.Add([]byte(mode3Rule(epBody("10.0.1.1", 8000, 0, `,"admin":"down"`))))
	f.Add([]byte(`{"serviceArguments":{"externalIP":"::1","port":1,"kvEngineType":"llamacpp","mode":4,"pd_disagg_mode":true},"endpoints":[{"endpointIP":"::2","targetPort":1,"weight":1,"ep_role":1},{"endpointIP":"::3","targetPort":1,"weight":1,"ep_role":2}]}`))
	srv := New(Options{Settings: config.DefaultSettings(), Log: quiet()})
	h := srv.Handler()
	f.Fuzz(func(t *testing.T, body []byte) {
		req := httptest.NewRequest(http.MethodPost, lbPath, strings.NewReader(string(body)))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != 200 && (rec.Code < 400 || rec.Code >= 500) {
			t.Fatalf("status %d for %q: %s", rec.Code, body, rec.Body.String())
		}
		if rec.Code != 200 && !strings.Contains(rec.Body.String(), `"code":4`) {
			t.Fatalf("error body %s", rec.Body.String())
		}
	})
}
