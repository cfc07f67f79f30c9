package pd

import (
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/epset"
)

// TestPrefillReservesProvisionalBlocks: while a leader's prefill runs on
// one prefill endpoint, a follower with the same prompt is a tier-1.5 hit
// on that endpoint when the plan reserves the prompt there (the gateway's
// pdPlan), and takes the load fallback to the other prefill endpoint when
// it does not (mode 1 before it reserved). After the leader's prefill
// answers, its reservation is gone.
func TestPrefillReservesProvisionalBlocks(t *testing.T) {
	tests := []struct {
		name         string
		reserve      bool
		wantFollower int // the follower's prefill endpoint
		wantHit      bool
	}{
		{name: "reserved: the follower joins the leader", reserve: true, wantFollower: 0, wantHit: true},
		{name: "not reserved: the follower goes elsewhere", reserve: false, wantFollower: 2, wantHit: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rel := make(chan struct{})
			leaderIn := make(chan struct{}, 1)
			hold := prefillAfter(rel)
			var held atomic.Bool
			leader := func(w http.ResponseWriter, r *http.Request, s seen) {
				if held.CompareAndSwap(false, true) {
					leaderIn <- struct{}{}
					hold(w, r, s)
					return
				}
				prefillOK("p0", 0)(w, r, s)
			}
			rg := newRig(t, []func(http.ResponseWriter, *http.Request, seen){leader, decodeOK("d"), prefillOK("p2", 0)},
				prefillRoles(), rigOptions{provisional: true, reserve: tc.reserve})
			body := `{"model":"m","prompt":"the same long prompt","max_tokens":2}`
			done := make(chan answer, 1)
			go func() { done <- rg.post(body) }()
			select {
			case <-leaderIn:
			case <-time.After(5 * time.Second):
				t.Fatal("the leader's prefill never reached endpoint 0")
			}
			follower := rg.post(body)
			close(rel)
			lead := <-done
			if lead.status != 200 || follower.status != 200 {
				t.Fatalf("statuses leader %d (%v), follower %d (%v)", lead.status, lead.err, follower.status, follower.err)
			}
			want := map[int]int{0: 1, 2: 0}
			want[tc.wantFollower]++
			for ep, n := range want {
				if got := len(rg.eps[ep].seen()); got != n {
					t.Fatalf("prefill endpoint %d saw %d requests, want %d", ep, got, n)
				}
			}
			if hits := rg.obs.get("hit"); (hits > 0) != tc.wantHit {
				t.Fatalf("tier-1.5 hits %d, want hit %v (observer %v)", hits, tc.wantHit, rg.obs.n)
			}
			rg.atRest()
			var all epset.Set
			all.Add(0)
			all.Add(2)
			var counts [epset.Max]uint32
			rg.overlay.Score([]uint64{11, 12, 13, 14}, all, true, &counts)
			if counts[0] != 0 || counts[2] != 0 {
				t.Fatalf("provisional blocks left after the prefills answered: %d, %d", counts[0], counts[2])
			}
		})
	}
}
