//go:build linux

package fault

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestOpenAISDKSeesBrokenStream runs the official OpenAI Node SDK
// (tests/e2e/node) against both data paths and kills the engine mid-stream:
// the SDK must raise an APIError carrying kvgate's message (the final
// error event), not hang and not a bare socket error. It skips without node
// or the npm modules, unless KVGATE_REQUIRE_NODE is set (CI).
func TestOpenAISDKSeesBrokenStream(t *testing.T) {
	requireRoot(t)
	node, err := exec.LookPath("node")
	dir := filepath.Join("..", "e2e", "node")
	_, modErr := os.Stat(filepath.Join(dir, "node_modules", "openai", "package.json"))
	if err != nil || modErr != nil {
		if os.Getenv("KVGATE_REQUIRE_NODE") != "" {
			t.Fatalf("KVGATE_REQUIRE_NODE is set but node (%v) or %s/node_modules/openai (%v) is missing", err, dir, modErr)
		}
		t.Skip("node or tests/e2e/node/node_modules missing (npm ci in tests/e2e/node)")
	}
	f := startFleet(t)
	for _, g := range f.paths {
		t.Run(g.name, func(t *testing.T) {
			cmd := exec.Command("nsenter", "--net=/run/netns/"+f.tp.gw, node, "broken.mjs", g.base+"/v1", model)
			cmd.Dir = dir
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			var stderr lockedBuf
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
			lines := make(chan string, 4)
			go func() {
				sc := bufio.NewScanner(out)
				for sc.Scan() {
					lines <- sc.Text()
				}
				close(lines)
			}()
			next := func() string {
				select {
				case l, ok := <-lines:
					if !ok {
						t.Fatalf("node exited early: %s", stderr.String())
					}
					return l
				case <-time.After(endBound + 15*time.Second):
					t.Fatalf("no answer from the SDK script: %s", stderr.String())
				}
				return ""
			}
			if l := next(); !strings.Contains(l, `"started":true`) {
				t.Fatalf("node: %s %s", l, stderr.String())
			}
			// The stream runs on one engine: kill the one whose
			// in-flight count is up.
			var victim *engine
			for _, e := range f.engines {
				if g.d.metric(t, "kvgate_endpoint_inflight", map[string]string{"ep_idx": f.epIdx(e.host)}) > 0 {
					victim = e
				}
			}
			if victim == nil {
				t.Fatal("no engine has the stream in flight")
			}
			victim.kill9(t)
			var res struct {
				OK      bool   `json:"ok"`
				Chunks  int    `json:"chunks"`
				Name    string `json:"name"`
				Message string `json:"message"`
			}
			l := next()
			if err := json.Unmarshal([]byte(l), &res); err != nil {
				t.Fatalf("node output %q: %v", l, err)
			}
			if res.OK || res.Name != "APIError" || !strings.Contains(res.Message, "closed the stream before its end") {
				t.Fatalf("the SDK saw %+v, want an APIError with kvgate's message", res)
			}
			t.Logf("%s: the SDK raised %s %q after %d chunks", g.name, res.Name, res.Message, res.Chunks)
			f.restart(t, victim.id)
		})
	}
}
