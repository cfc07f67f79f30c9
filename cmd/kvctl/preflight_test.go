package main

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// runPreflight runs `kvctl preflight` in-process against apiURL and returns
// stdout and the exit code main would use.
func runPreflight(t *testing.T, apiURL string, args ...string) (string, int) {
	t.Helper()
	r := &cobra.Command{Use: "kvctl", SilenceUsage: true, SilenceErrors: true}
	r.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &inputError{msg: err.Error()} })
	r.AddCommand(newPreflightCmd())
	var out bytes.Buffer
	r.SetOut(&out)
	r.SetErr(io.Discard)
	r.SetArgs(append([]string{"preflight"}, append(args, "--api-server="+apiURL)...))
	err := r.Execute()
	code := 0
	if err != nil {
		code = 1
		var in *inputError
		if errors.As(err, &in) {
			code = 2
		}
	}
	return out.String(), code
}

func TestPreflightExitCodes(t *testing.T) {
	const failReport = `{"result":"fail","checks":[{"id":"parity","ep_idx":0,"result":"fail","detail":"the last BlockStored hashed differently from kvgate","fix":"engine 10.0.0.2 hashes with PYTHONHASHSEED=1; kvgate has LLB_KV_NONE_HASH_SEED=0"},{"id":"probe","ep_idx":-1,"result":"skip","detail":"probe disabled","fix":""}]}`
	const passReport = `{"result":"pass","checks":[{"id":"health","ep_idx":0,"result":"pass","detail":"serves m","fix":""}]}`
	var gotQuery string
	answer := func(status int, body string) *httptest.Server {
		ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			gotQuery = r.Method + " " + r.URL.Path + "?" + r.URL.RawQuery
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_, _ = w.Write([]byte(body))
		}))
		t.Cleanup(ts.Close)
		return ts
	}
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	down := "http://" + l.Addr().String()
	l.Close()
	cases := []struct {
		name  string
		url   string
		args  []string
		code  int
		out   []string
		query string
	}{
		{"pass", answer(200, passReport).URL, []string{"--service-id", "1"}, 0, []string{"health", "PASS", "preflight: PASS"}, "POST /netlox/v1/config/ai/kv/preflight?service_id=1"},
		{"fail", answer(200, failReport).URL, []string{"--service-id", "1", "--no-probe"}, 1,
			[]string{"parity", "FAIL", "fix: engine 10.0.0.2 hashes with PYTHONHASHSEED=1", "probe", "SKIP", "preflight: FAIL"}, "POST /netlox/v1/config/ai/kv/preflight?probe=0&service_id=1"},
		{"json", answer(200, failReport).URL, []string{"--service-id", "1", "--json"}, 1, []string{`"result":"fail"`}, ""},
		{"api-error", answer(404, `{"code":404,"message":"no rule with service_id 9"}`).URL, []string{"--service-id", "9"}, 2, nil, ""},
		{"not-a-report", answer(200, `{}`).URL, []string{"--service-id", "1"}, 2, nil, ""},
		{"unreachable", down, []string{"--service-id", "1"}, 2, nil, ""},
		{"no-service-id", down, nil, 2, nil, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			gotQuery = ""
			out, code := runPreflight(t, tc.url, tc.args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d; output:\n%s", code, tc.code, out)
			}
			for _, w := range tc.out {
				if !strings.Contains(out, w) {
					t.Fatalf("output lacks %q:\n%s", w, out)
				}
			}
			if tc.query != "" && gotQuery != tc.query {
				t.Fatalf("asked %q, want %q", gotQuery, tc.query)
			}
		})
	}
}

// TestPreflightProgress: kvctl says what it is waiting for at once, on
// stderr, and stops talking when the answer arrives.
func TestPreflightProgress(t *testing.T) {
	var buf bytes.Buffer
	stop := progress(&buf, "preflight: running the checks of service 1 (probe true)")
	stop()
	if got := buf.String(); got != "preflight: running the checks of service 1 (probe true)…\n" {
		t.Fatalf("progress printed %q", got)
	}
}
