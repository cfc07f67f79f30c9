// Package durability checks kvgate's promise that an acknowledged rule change
// survives a crash: the real daemon binary is killed with SIGKILL while
// clients create, update and delete rules, and the restarted daemon must
// hold, for every rule, the last acknowledged state or the change that was
// in flight at the kill (docs/api.md "Persistence").
package durability

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/syncbuf"
	"github.com/kvgate/kvgate/internal/testnet"
)

const (
	workers       = 4
	keysPerWorker = 3
)

// state is what a client last did to a rule key: the generation it wrote
// (carried as the rule's name and its endpoint's targetPort) or -1 after a
// delete.
type state struct {
	acked    int  // last acknowledged generation, -1 absent
	inflight int  // generation of the request in flight at the kill, if any
	pending  bool // a request was in flight
}

type daemon struct {
	cmd    *exec.Cmd
	api    string
	logs   *syncbuf.Buffer
	exited chan error
}

func startDaemon(t *testing.T, bin, api, stateDir, tokDir string) *daemon {
	t.Helper()
	d := &daemon{api: "http://" + api, logs: &syncbuf.Buffer{}, exited: make(chan error, 1)}
	d.cmd = exec.Command(bin, "--api", api, "--state-dir", stateDir, "--tokenizer-dir", tokDir, "--datapath", "userspace", "--shutdown-grace", "2s")
	d.cmd.Stderr = d.logs
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.exited <- d.cmd.Wait() }()
	t.Cleanup(func() {
		_ = d.cmd.Process.Kill()
		<-d.exited
		d.exited <- nil
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(d.api + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return d
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("kvgate not ready after 30 s: %v\n%s", err, d.logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func ruleBody(vip string, port, gen int) string {
	return fmt.Sprintf(`{"serviceArguments":{"externalIP":%q,"port":%d,"protocol":"tcp","sel":0,"mode":4,"probetype":"none","name":"gen-%d"},`+
		`"endpoints":[{"endpointIP":"192.0.2.10","targetPort":%d,"weight":1}]}`, vip, port, gen, 1000+gen)
}

// TestSIGKILLDuringRuleChurnLosesNothingAcknowledged: the state after a crash
// and restart matches what the API acknowledged, rule by rule.
func TestSIGKILLDuringRuleChurnLosesNothingAcknowledged(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the kvgate binary")
	}
	bin := filepath.Join(t.TempDir(), "kvgate")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/kvgate").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	block := testnet.Block(t)
	api := fmt.Sprintf("%s2:%d", block, testnet.Port(t, block+"2"))
	vip := block + "1"
	stateDir, tokDir := t.TempDir(), t.TempDir()
	// Distinct ports: two keys on one port would share a rule, and the check
	// below would compare it with two histories (a flake seen in CI).
	ports := testnet.Ports(t, vip, workers*keysPerWorker)
	d := startDaemon(t, bin, api, stateDir, tokDir)

	states := make([]state, len(ports))
	for i := range states {
		states[i].acked = -1
	}
	var mu sync.Mutex
	stop := make(chan struct{})
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 10 * time.Second}
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for gen := 1; ; gen++ {
				select {
				case <-stop:
					return
				default:
				}
				k := w*keysPerWorker + rng.IntN(keysPerWorker)
				var req *http.Request
				target := gen
				if rng.IntN(4) == 0 {
					target = -1
					req, _ = http.NewRequest("DELETE", fmt.Sprintf("%s/netlox/v1/config/loadbalancer/externalipaddress/%s/port/%d/protocol/tcp", d.api, vip, ports[k]), nil)
				} else {
					req, _ = http.NewRequest("POST", d.api+"/netlox/v1/config/loadbalancer", strings.NewReader(ruleBody(vip, ports[k], gen)))
				}
				mu.Lock()
				states[k].inflight, states[k].pending = target, true
				mu.Unlock()
				resp, err := client.Do(req)
				if err != nil {
					return // the daemon died with this request in flight
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				mu.Lock()
				switch {
				case resp.StatusCode == 200:
					states[k].acked, states[k].pending = target, false
				case target == -1 && resp.StatusCode == 404: // deleting an absent rule changes nothing
					states[k].pending = false
				default:
					mu.Unlock()
					t.Errorf("%s %s: status %d", req.Method, req.URL.Path, resp.StatusCode)
					return
				}
				mu.Unlock()
			}
		}()
	}
	time.Sleep(time.Duration(300+rand.IntN(700)) * time.Millisecond)
	if err := d.cmd.Process.Kill(); err != nil { // SIGKILL: no shutdown path runs
		t.Fatal(err)
	}
	close(stop)
	wg.Wait()
	<-d.exited
	d.exited <- nil

	mu.Lock()
	acked := 0
	for _, s := range states {
		if s.acked >= 0 {
			acked++
		}
	}
	mu.Unlock()
	if acked == 0 {
		t.Fatalf("no rule was acknowledged before the kill; the churn did not run\n%s", d.logs.String())
	}

	d2 := startDaemon(t, bin, api, stateDir, tokDir)
	resp, err := http.Get(d2.api + "/netlox/v1/config/loadbalancer/all")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var all struct {
		LBAttr []struct {
			ServiceArguments struct {
				Port int    `json:"port"`
				Name string `json:"name"`
			} `json:"serviceArguments"`
			Endpoints []struct {
				TargetPort int `json:"targetPort"`
			} `json:"endpoints"`
		} `json:"lbAttr"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&all); err != nil {
		t.Fatal(err)
	}
	restored := map[int]int{}
	for _, r := range all.LBAttr {
		var gen int
		if _, err := fmt.Sscanf(r.ServiceArguments.Name, "gen-%d", &gen); err != nil || len(r.Endpoints) != 1 || r.Endpoints[0].TargetPort != 1000+gen {
			t.Errorf("restored rule is torn: %+v", r)
		}
		restored[r.ServiceArguments.Port] = gen
		// A restored rule serves again: its VIP accepts connections.
		if c, err := net.DialTimeout("tcp", net.JoinHostPort(vip, strconv.Itoa(r.ServiceArguments.Port)), 5*time.Second); err != nil {
			t.Errorf("restored rule on port %d does not listen: %v", r.ServiceArguments.Port, err)
		} else {
			c.Close()
		}
	}
	for k, s := range states {
		got, ok := restored[ports[k]]
		if !ok {
			got = -1
		}
		if got != s.acked && !(s.pending && got == s.inflight) {
			t.Errorf("rule on port %d: restored generation %d, acknowledged %d (in flight: %v %d)", ports[k], got, s.acked, s.pending, s.inflight)
		}
	}
	t.Logf("%d rules acknowledged before the kill, %d restored", acked, len(all.LBAttr))
	if _, err := os.Stat(filepath.Join(stateDir, "rules.json")); err != nil {
		t.Errorf("state file: %v", err)
	}
}
