package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestProvisionalBlocksCoLocateANewPrefix sends one request with a new long
// prefix through kvgate, and while the engine is still prefilling it (no
// BlockStored yet), two more with the same prefix. With provisional blocks
// kvgate credits the first request's predicted blocks to its engine and
// sends the followers there (tier 1.5 hits); without them the followers see
// no overlap anywhere (no_worker) and the fallback spreads them, each
// computing the prefix again. The load blend is off (LOXILB_KV_LB_MODE=off)
// so only the overlap decides. Engines cache (and report) a prompt's blocks
// when they schedule it, as vLLM V1 does, so the window kvgate is blind in
// is the leader's wait in the engine's queue: every engine is kept busy for
// one step, and the engines run 20× slower than the model so that step is
// seconds long on a loaded machine.
func TestProvisionalBlocksCoLocateANewPrefix(t *testing.T) {
	env := fleetEnv(t)
	for _, tc := range []struct {
		policy     string
		colocated  bool
		wantReason string
	}{
		{"kvgate-off", true, "hit"},
		{"kvgate-off-noprov", false, "no_worker"},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			ctx, fleet, front := slowFleet(t, env, tc.policy)
			// Keep every engine's next step busy with a long prompt sent
			// to it directly (kvgate does not see it), so the leader waits
			// in the queue and its BlockStored comes only when that step
			// ends: the window in which kvgate cannot yet know the prefix.
			for _, u := range fleet.URLs() {
				resp, err := openCompletion(ctx, u, prose(rand.New(rand.NewPCG(7, 8)), 6000)+" "+u)
				if err != nil {
					t.Fatal(err)
				}
				defer drain(resp)
			}
			leader, followers := coLocationRound(ctx, t, front.URL)
			for _, f := range followers {
				same := f.ep == leader.ep
				if same != tc.colocated || f.reason != tc.wantReason {
					t.Errorf("follower on ep %d (%s), leader on ep %d: want co-located %v with reason %s",
						f.ep, f.reason, leader.ep, tc.colocated, tc.wantReason)
				}
			}
		})
	}
}

// fleetEnv is the environment of a test that starts simulated fleets
// (skipped under -short), closed when the test ends.
func fleetEnv(t *testing.T) *Env {
	t.Helper()
	if testing.Short() {
		t.Skip("starts simulated fleets")
	}
	env, err := NewEnv("../../../pkg/tokenizer/testdata/qwen3", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(env.Close)
	return env
}

// slowFleet starts a 3-engine fleet running 20× slower than the model (so a
// long prefill lasts seconds even on a loaded machine) with policy in front,
// warmed up; both stop, and the context ends, when the test does.
func slowFleet(t *testing.T, env *Env, policy string) (context.Context, *Fleet, *Front) {
	t.Helper()
	prof := Profile{Name: "ci", PerfModel: "llama3-8b-h100", Engines: 3, NumGPUBlocks: 2000, TimeScale: 20}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	fleet, err := StartFleet(env, prof)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fleet.Close)
	front, err := StartFront(ctx, env, fleet, prof, policy)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(front.Close)
	if err := WarmUp(ctx, front.URL, fleet); err != nil {
		t.Fatal(err)
	}
	return ctx, fleet, front
}

type routed struct {
	ep     int
	reason string
}

// coLocationRound sends the leader, waits for its response head (kvgate
// has routed it and the engine has queued it; enginesim, as vLLM, sends the
// head before prefilling), then the two followers at once, and reads
// where kvgate sent each from x-kvgate-decision.
func coLocationRound(ctx context.Context, t *testing.T, base string) (routed, []routed) {
	t.Helper()
	prefix := prose(rand.New(rand.NewPCG(42, 43)), 1000)
	lead, err := openCompletion(ctx, base, prefix+" first question?")
	if err != nil {
		t.Fatal(err)
	}
	defer drain(lead)
	var mu sync.Mutex
	var wg sync.WaitGroup
	var followers []routed
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := routeOf(ctx, base, fmt.Sprintf("%s follow-up question %d?", prefix, i))
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			followers = append(followers, r)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return parseDecision(t, lead.Header.Get("x-kvgate-decision")), followers
}

// openCompletion starts a streamed two-token completion and returns once
// its response head arrived.
func openCompletion(ctx context.Context, base, prompt string) (*http.Response, error) {
	body, _ := json.Marshal(map[string]any{"model": Model, "prompt": prompt, "max_tokens": 2, "stream": true, "ignore_eos": true})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+PathCompletion, strings.NewReader(string(body)))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	return http.DefaultClient.Do(req)
}

func drain(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
}

// routeOf sends prompt as a streamed completion and reads where kvgate
// routed it; safe to call from any goroutine.
func routeOf(ctx context.Context, base, prompt string) (routed, error) {
	resp, err := openCompletion(ctx, base, prompt)
	if err != nil {
		return routed{}, err
	}
	defer drain(resp)
	return decisionOf(resp.Header.Get("x-kvgate-decision"))
}

// parseDecision is decisionOf, failing the test on an error.
func parseDecision(t *testing.T, v string) routed {
	t.Helper()
	r, err := decisionOf(v)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// decisionOf reads "tier=1.5; ep=0; score=12; reason=hit".
func decisionOf(v string) (routed, error) {
	r := routed{ep: -1}
	for _, part := range strings.Split(v, ";") {
		k, val, _ := strings.Cut(strings.TrimSpace(part), "=")
		switch k {
		case "ep":
			r.ep, _ = strconv.Atoi(val)
		case "reason":
			r.reason = val
		}
	}
	if r.ep < 0 {
		return r, fmt.Errorf("x-kvgate-decision %q names no endpoint", v)
	}
	return r, nil
}

// TestBurstOfANewPrefixFollowsItsFirst sends several requests of each of a
// few new long prefixes all at once, as a closed-loop client fleet does when
// it starts. kvgate decides and reserves as one step, so of each prefix's
// requests the first decided is a miss and the rest find its provisional
// blocks (they follow it unless spill relief moves them for load). When the reservation came only after
// the proxy connected, requests decided in that window all scored zero and
// the fallback spread one prefix over the fleet (capacity under 48
// closed-loop clients cached 36 % against the SGLang router's 62 %,
// docs/routing-benchmark.md, "Full sweep").
func TestBurstOfANewPrefixFollowsItsFirst(t *testing.T) {
	env := fleetEnv(t)
	ctx, _, front := slowFleet(t, env, "kvgate-off")
	const groups, perGroup = 6, 4
	var (
		mu    sync.Mutex
		wg    sync.WaitGroup
		start = make(chan struct{})
		got   = map[int][]routed{}
	)
	for g := range groups {
		prefix := prose(rand.New(rand.NewPCG(100+uint64(g), 7)), 800)
		for i := range perGroup {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				r, err := routeOf(ctx, front.URL, fmt.Sprintf("%s question %d?", prefix, i))
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				got[g] = append(got[g], r)
				mu.Unlock()
			}()
		}
	}
	close(start)
	wg.Wait()
	for g, rs := range got {
		misses := 0
		for _, r := range rs {
			if r.reason == "no_worker" {
				misses++
			}
		}
		if misses != 1 {
			t.Errorf("prefix %d: %d of %d requests scored no overlap (%v), want only the first", g, misses, len(rs), rs)
		}
	}
}
