package replicas

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/enginesim"
	"github.com/kvgate/kvgate/internal/testnet"
)

const rulesTemplate = `# Both replicas mount this file; ${KVGATE_VIP} is each one's own VIP.
rules:
  - serviceArguments:
      service_id: 5
      name: pool
      externalIP: ${KVGATE_VIP}
      port: %d
      mode: 4
      kvExactMode: 3
      kvZmqPort: %d
      kvHashAlgo: sha256_cbor
      kvBlockSize: 16
      probetype: http
      probereq: /health
      probeInterval: 1
      probeTimeout: 1
    endpoints:
%s  - serviceArguments:
      service_id: 9
      name: %s
      externalIP: ${KVGATE_VIP}
      port: %d
      mode: 4
      kvExactMode: 1
      kvZmqPort: %d
      kvHashAlgo: sha256_cbor
      kvBlockSize: 16
      probetype: http
      probereq: /health
      probeInterval: 1
      probeTimeout: 1
    endpoints:
%s`

// TestActiveActiveReplicas: two daemons load one rules file. They number
// endpoints alike, refuse REST changes to file rules with 409, both follow a
// file edit, the load cap of replica A counts what replica B sends an
// endpoint (from the engine's own metrics), and a conversation whose turns
// alternate between the replicas stays on one P/D pair.
func TestActiveActiveReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the kvgate binary")
	}
	bin := filepath.Join(t.TempDir(), "kvgate")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/kvgate").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	tok, err := enginesim.LoadTokenizer(repoTokenizerDir(t))
	if err != nil {
		t.Fatal(err)
	}
	tokDir := t.TempDir()
	if err := os.Symlink(repoTokenizerDir(t), filepath.Join(tokDir, "Qwen__Qwen3-0.6B")); err != nil {
		t.Fatal(err)
	}
	block := testnet.Block(t)
	pool, poolZMQ := startEngines(t, tok, block, 11, 3, enginesim.RoleBoth)
	// Slow prefills (2 ms per uncached token): a long prompt keeps its
	// prefill engine busy for seconds, a short one is done in milliseconds.
	prefill, pdZMQ := startEngines(t, tok, block, 21, 2, enginesim.RolePrefill, func(c *enginesim.Config) { c.PrefillUsPerToken = 2000 })
	decode, _ := startEngines(t, tok, block, 31, 2, enginesim.RoleDecode)
	// Distinct ports per rule; each replica binds them on its own VIP.
	poolPort, pdPort := testnet.Port(t, block+"3"), testnet.Port(t, block+"3")
	poolIdx := []int{2, 0, 1} // not the posting order: the file decides
	pdEngines := append(append([]*enginesim.Engine{}, prefill...), decode...)
	render := func(pdName string) string {
		return fmt.Sprintf(rulesTemplate, poolPort, poolZMQ, endpointsYAML(t, pool, poolIdx, []int{0, 0, 0}),
			pdName, pdPort, pdZMQ, endpointsYAML(t, pdEngines, []int{10, 11, 20, 21}, []int{1, 1, 2, 2}))
	}
	rulesFile := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(rulesFile, []byte(render("pd")), 0o644); err != nil {
		t.Fatal(err)
	}
	// B routes by overlap without fleet-wide relief, so it piles a hot
	// prefix onto one endpoint; A runs the default cap with relief.
	// Both place cold prompts by their hash (LLB_KV_COLD_PLACEMENT=hash).
	a := startDaemon(t, bin, block, "2", "3", rulesFile, tokDir, "LLB_KV_COLD_PLACEMENT=hash")
	b := startDaemon(t, bin, block, "4", "5", rulesFile, tokDir, "LOXILB_KV_SPILL_RELIEF=off", "LLB_KV_COLD_PLACEMENT=hash")

	t.Run("identical ep_idx", func(t *testing.T) {
		ra, _ := a.rules()
		rb, _ := b.rules()
		if identity(ra) != identity(rb) {
			t.Fatalf("replicas differ:\nA %s\nB %s", identity(ra), identity(rb))
		}
		h, p := hostPort(t, pool[0])
		if want := fmt.Sprintf(" %s:%d=2", h, p); !strings.Contains(identity(ra), want) {
			t.Fatalf("the file's ep_idx not kept (want %q): %s", want, identity(ra))
		}
		if ra[0].Owner != rulesFile || ra[0].ServiceArguments.ServiceID != 5 {
			t.Fatalf("rule 0 on A: %+v", ra[0])
		}
	})

	t.Run("REST changes to file rules answer 409", func(t *testing.T) {
		path := fmt.Sprintf("/netlox/v1/config/loadbalancer/externalipaddress/%s/port/%d/protocol/tcp", a.vip, poolPort)
		for _, c := range []struct{ method, path, body string }{
			{"DELETE", path, ""},
			{"PATCH", path, `{"serviceArguments":{"name":"mine"}}`},
			{"POST", "/netlox/v1/config/loadbalancer", fmt.Sprintf(`{"serviceArguments":{"externalIP":%q,"port":%d,"mode":4},"endpoints":[]}`, a.vip, poolPort)},
		} {
			code, body, err := a.do(c.method, c.path, c.body)
			if err != nil || code != 409 || !strings.Contains(body, rulesFile) || !strings.Contains(body, `"code":409`) {
				t.Fatalf("%s %s: %d %s %v", c.method, c.path, code, body, err)
			}
		}
	})

	t.Run("a file edit reaches both replicas", func(t *testing.T) {
		if err := os.WriteFile(rulesFile+".new", []byte(render("pd-renamed")), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(rulesFile+".new", rulesFile); err != nil { // an atomic swap, as a ConfigMap update is
			t.Fatal(err)
		}
		for _, d := range []*daemon{a, b} {
			waitFor(t, 10*time.Second, d.api+" reconciling the edit", func() bool {
				rules, err := d.rules()
				return err == nil && len(rules) == 2 && rules[1].ServiceArguments.Name == "pd-renamed"
			})
		}
		ra, _ := a.rules()
		rb, _ := b.rules()
		if identity(ra) != identity(rb) {
			t.Fatalf("replicas differ after the edit:\nA %s\nB %s", identity(ra), identity(rb))
		}
	})

	t.Run("both replicas place a new prefix on one engine", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		samePlacement(ctx, t, a, b, poolPort)
	})

	t.Run("A's cap counts B's load on the engine", func(t *testing.T) {
		hot := strings.Repeat("The replicas share one fleet and one hot system prompt. ", 12)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		home, err := complete(ctx, b.vip, poolPort, hot+"warm", 1, "")
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "A mirroring the hot prefix", func() bool { return inventoryBlocks(a, 5, home) > 0 })
		waitFor(t, 10*time.Second, "B mirroring the hot prefix", func() bool { return inventoryBlocks(b, 5, home) > 0 })
		// B sends 6 long requests with the hot prefix: all land on home.
		var wg sync.WaitGroup
		bEps := make([]int, 6)
		for i := range bEps {
			wg.Add(1)
			go func() {
				defer wg.Done()
				bEps[i], _ = complete(ctx, b.vip, poolPort, fmt.Sprintf("%s question %d", hot, i), 300, "")
			}()
		}
		defer wg.Wait()
		homeEngine := pool[indexOf(poolIdx, home)]
		waitFor(t, 10*time.Second, "B's load on the home engine", func() bool { return engineRunning(t, homeEngine) >= 6 })
		time.Sleep(2500 * time.Millisecond) // two scrapes (probeInterval 1 s) see it
		got, err := complete(ctx, a.vip, poolPort, hot+" from A", 1, "")
		if err != nil {
			t.Fatal(err)
		}
		if got == home {
			t.Fatalf("A sent the hot prefix to ep %d, which B already loads with %d requests (B's picks %v)", home, engineRunning(t, homeEngine), bEps)
		}
		cancel()
	})

	t.Run("a conversation stays on one pair across replicas", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		// One request without a session through A only: the replicas' own
		// round-robin cursors no longer move in step, so only a pair derived
		// from the key can agree.
		if _, err := complete(ctx, a.vip, pdPort, "no session here", 2, ""); err != nil {
			t.Fatal(err)
		}
		for i := range 6 {
			session := fmt.Sprintf("conversation-%d", i)
			var eps []int
			for turn := range 4 {
				d := []*daemon{a, b}[turn%2]
				ep, err := complete(ctx, d.vip, pdPort, fmt.Sprintf("turn %d of %s", turn, session), 2, session)
				if err != nil {
					t.Fatalf("%s turn %d via %s: %v", session, turn, d.api, err)
				}
				eps = append(eps, ep)
			}
			for _, ep := range eps {
				if ep != eps[0] {
					t.Fatalf("%s moved between replicas: prefill ep_idx per turn %v", session, eps)
				}
			}
		}
	})

	t.Run("A's prefill pick avoids the prefill endpoint B loads", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		sharedPDPrefill(ctx, t, a, b, pdPort, prefill, []int{10, 11})
	})
}

// sharedPDPrefill: replica B keeps one prefill endpoint busy with long
// prefills (one session key, so B's own pick piles them there); once A's
// scrape has seen them, A's cold prompts must all go to the other prefill
// endpoint. A's own admission count is 0 on both, so with only its own
// count A places them by hash or round-robin, about half on the busy one.
func sharedPDPrefill(ctx context.Context, t *testing.T, a, b *daemon, port int, prefill []*enginesim.Engine, idx []int) {
	t.Helper()
	const loaders = 4
	var wg sync.WaitGroup
	defer wg.Wait()
	bEps := make([]int, loaders)
	errs := make([]error, loaders)
	for i := range loaders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// ~3,000 uncached tokens: about 6 s of prefill each, long
			// enough for A's scrape and picks on a loaded machine.
			long := strings.Repeat(fmt.Sprintf("load %d item ", i), 750)
			bEps[i], errs[i] = complete(ctx, b.vip, port, long, 1, "loader")
		}()
	}
	busy := -1
	waitFor(t, 15*time.Second, "B's prefills running on one prefill engine", func() bool {
		for k, e := range prefill {
			if engineRunning(t, e) >= loaders {
				busy = k
				return true
			}
		}
		return false
	})
	time.Sleep(1500 * time.Millisecond) // A's next scrape (probeInterval 1 s) sees them
	starts := []string{"Amber", "Birch", "Cedar", "Dune", "Ember", "Fjord"}
	var picks []int
	for i, w := range starts {
		ep, err := complete(ctx, a.vip, port, fmt.Sprintf("%s: a short new question number %d for replica A", w, i), 1, "")
		if err != nil {
			t.Fatal(err)
		}
		picks = append(picks, ep)
	}
	if still := engineRunning(t, prefill[busy]); still == 0 {
		t.Fatalf("B's prefills ended before A's picks were done: the test proves nothing (picks %v)", picks)
	}
	for _, ep := range picks {
		if ep == idx[busy] {
			t.Fatalf("A sent prefills to ep %d, which B loads: A's picks %v", idx[busy], picks)
		}
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil || bEps[i] != idx[busy] {
			t.Fatalf("B's loader %d: ep %d, %v (busy ep %d)", i, bEps[i], err, idx[busy])
		}
	}
}

// samePlacement sends each of 8 new prefixes to both replicas at once,
// before either has the other's KV events, and checks that both place it
// on the same engine. Between rounds A alone places an unrelated prompt, so
// the replicas' round-robin cursors do not stay in step: only a placement
// derived from the prompt agrees every time.
func samePlacement(ctx context.Context, t *testing.T, a, b *daemon, port int) {
	t.Helper()
	for i := range 8 {
		prefix := fmt.Sprintf("Prefix %d, new to every engine: ", i) + strings.Repeat(fmt.Sprintf("cold placement case %d. ", i), 10)
		if i%2 == 1 {
			if _, err := complete(ctx, a.vip, port, fmt.Sprintf("Unrelated %d: %s", i, strings.Repeat("filler words ", 12)), 1, ""); err != nil {
				t.Fatal(err)
			}
		}
		var eps [2]int
		var errs [2]error
		var wg sync.WaitGroup
		for k, d := range []*daemon{a, b} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				eps[k], errs[k] = complete(ctx, d.vip, port, prefix+fmt.Sprintf("question from replica %d", k), 1, "")
			}()
		}
		wg.Wait()
		if errs[0] != nil || errs[1] != nil {
			t.Fatalf("prefix %d: %v %v", i, errs[0], errs[1])
		}
		if eps[0] != eps[1] {
			t.Fatalf("prefix %d: replica A placed it on ep %d, replica B on ep %d", i, eps[0], eps[1])
		}
	}
}

func indexOf(idx []int, v int) int {
	for i, x := range idx {
		if x == v {
			return i
		}
	}
	return -1
}
