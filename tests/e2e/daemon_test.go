package e2e

import (
	"net/http"
	"syscall"
	"testing"
	"time"
)

// startGatewayProcess starts the kvgate binary listening on api with args
// (and LLB_KV_NONE_HASH_SEED=0, the engines' PYTHONHASHSEED=0), waits for
// its API, and at cleanup stops it with SIGTERM (killing it after 15 s) and
// prints its log when the test failed.
func startGatewayProcess(t *testing.T, bin, api string, args ...string) (*testGateway, *proc) {
	t.Helper()
	p := startProc(t, []string{"LLB_KV_NONE_HASH_SEED=0"}, bin, append([]string{"--api", api}, args...)...)
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(15 * time.Second):
		}
		if t.Failed() {
			t.Logf("kvgate log:\n%s", p.logs.String())
		}
	})
	tg := &testGateway{api: "http://" + api}
	waitFor(t, "the management API", 20*time.Second, func() bool {
		resp, err := http.Get(tg.api + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	})
	return tg, p
}
