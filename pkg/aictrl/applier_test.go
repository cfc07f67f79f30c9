package aictrl

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"

	pb "github.com/kvgate/kvgate/pkg/aictrl/aictrlpb"
	"github.com/kvgate/kvgate/pkg/epset"
	"github.com/kvgate/kvgate/pkg/selector"
)

const svcKey = "10.10.10.254:8080:tcp"

// rules is an in-memory gateway: the rule's endpoints and the advice each
// selector was last given.
type rules struct {
	mu     sync.Mutex
	eps    map[string]map[int]string
	advice map[string]*selector.Advice
	sets   int
	down   epset.Set
}

func newRules() *rules {
	return &rules{eps: map[string]map[int]string{svcKey: {0: "10.0.0.11:8000", 1: "10.0.0.12:8000"}},
		advice: map[string]*selector.Advice{}}
}

func (r *rules) AdviceEndpoints(k string) (map[int]string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.eps[k]
	return e, ok
}

func (r *rules) SetAdvice(k string, a *selector.Advice) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.advice[k] = a
	r.sets++
}

func (r *rules) Unavailable(string) epset.Set { return r.down }

func (r *rules) get() *selector.Advice {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.advice[svcKey]
}

type clock struct{ t time.Time }

func newApplier(t *testing.T, cfg Config) (*Applier, *rules, *clock) {
	t.Helper()
	cfg.Addr = "127.0.0.1:1"
	r := newRules()
	a, err := NewApplier(cfg, r, prometheus.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	a.now = func() time.Time { return c.t }
	return a, r, c
}

func snap(c *clock, boot string, epoch uint64, eps ...*pb.EpEntry) *pb.Snapshot {
	if eps == nil {
		eps = []*pb.EpEntry{
			{EpIdx: 0, EpAddr: "10.0.0.11:8000", Weight: 100, State: pb.EpState_EP_STATE_ACTIVE},
			{EpIdx: 1, EpAddr: "10.0.0.12:8000", Weight: 40, State: pb.EpState_EP_STATE_ACTIVE},
		}
	}
	return &pb.Snapshot{Epoch: epoch, BootId: boot, StalenessDeadlineUnixMs: uint64(c.t.Add(30 * time.Second).UnixMilli()),
		MinApplierVersion: 1, Nonce: "n", Services: []*pb.ServiceSnapshot{{ServiceKey: svcKey, Eps: eps}}}
}

func TestAcceptance(t *testing.T) {
	a, r, c := newApplier(t, Config{})
	steps := []struct {
		name  string
		boot  string
		epoch uint64
		ok    bool
	}{
		{"first", "b1", 5, true},
		{"same epoch ignored", "b1", 5, false},
		{"older epoch ignored", "b1", 4, false},
		{"greater epoch", "b1", 6, true},
		{"new boot_id with a smaller epoch", "b2", 1, true},
		{"the old boot_id is new again", "b1", 1, true},
	}
	for _, s := range steps {
		st, detail, ok := a.Handle(snap(c, s.boot, s.epoch))
		if ok != s.ok || (ok && st != pb.AckStatus_ACK_STATUS_APPLIED) {
			t.Fatalf("%s: ok %v status %v %s", s.name, ok, st, detail)
		}
	}
	if got := testutil.ToFloat64(a.m.applied); got != 4 {
		t.Fatalf("snapshots applied %v", got)
	}
	adv := r.get()
	if adv == nil || adv.Weight[1] != 40 || adv.Weight[0] != 100 {
		t.Fatalf("advice %+v", adv)
	}
	if testutil.ToFloat64(a.m.weight.WithLabelValues(svcKey, "1")) != 40 || testutil.ToFloat64(a.m.mode) != ModeAdvised {
		t.Fatal("metrics not set")
	}
}

func TestNack(t *testing.T) {
	ep := func(idx uint32, addr string, w uint32, st pb.EpState) *pb.EpEntry {
		return &pb.EpEntry{EpIdx: idx, EpAddr: addr, Weight: w, State: st}
	}
	ok0 := ep(0, "10.0.0.11:8000", 100, pb.EpState_EP_STATE_ACTIVE)
	cases := []struct {
		name string
		mod  func(*pb.Snapshot)
		want string
	}{
		{"ep_addr of another ep_idx (LoxiLB's sorted-IP numbering)", func(s *pb.Snapshot) {
			s.Services[0].Eps = []*pb.EpEntry{ep(0, "10.0.0.12:8000", 50, 1), ep(1, "10.0.0.11:8000", 100, 1)}
		}, "ep_idx 0: ep_addr 10.0.0.12:8000, expected 10.0.0.11:8000; ep_idx 1: ep_addr 10.0.0.11:8000, expected 10.0.0.12:8000"},
		{"unknown ep_idx", func(s *pb.Snapshot) { s.Services[0].Eps = []*pb.EpEntry{ok0, ep(7, "10.0.0.13:8000", 1, 1)} },
			"ep_idx 7 (10.0.0.13:8000): no such endpoint"},
		{"bad ep_addr", func(s *pb.Snapshot) { s.Services[0].Eps = []*pb.EpEntry{ep(0, "node-a:8000", 1, 1)} },
			"ep_addr node-a:8000, expected 10.0.0.11:8000"},
		{"duplicate ep_idx", func(s *pb.Snapshot) { s.Services[0].Eps = []*pb.EpEntry{ok0, ok0} }, "ep_idx 0: twice"},
		{"weight above 100", func(s *pb.Snapshot) { s.Services[0].Eps = []*pb.EpEntry{ep(0, "10.0.0.11:8000", 101, 1)} }, "weight 101"},
		{"unknown state", func(s *pb.Snapshot) { s.Services[0].Eps = []*pb.EpEntry{ep(0, "10.0.0.11:8000", 1, 9)} }, "state 9"},
		{"unknown service", func(s *pb.Snapshot) { s.Services[0].ServiceKey = "10.10.10.254:9090:tcp" }, "no such rule"},
		{"malformed service key", func(s *pb.Snapshot) { s.Services[0].ServiceKey = "vip" }, "want vip:port:proto"},
		{"service twice", func(s *pb.Snapshot) { s.Services = append(s.Services, s.Services[0]) }, "twice in one snapshot"},
		{"past deadline", func(s *pb.Snapshot) { s.StalenessDeadlineUnixMs = 1 }, "already past"},
		{"deadline too far ahead", func(s *pb.Snapshot) { s.StalenessDeadlineUnixMs = 1 << 50 }, "ahead"},
		{"newer applier needed", func(s *pb.Snapshot) { s.MinApplierVersion = 2 }, "min_applier_version 2"},
		{"no boot_id", func(s *pb.Snapshot) { s.BootId = "" }, "boot_id"},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, r, clk := newApplier(t, Config{})
			s := snap(clk, "b", uint64(i+1))
			c.mod(s)
			st, detail, ok := a.Handle(s)
			if !ok || st != pb.AckStatus_ACK_STATUS_REJECTED || !strings.Contains(detail, c.want) {
				t.Fatalf("ok %v status %v detail %q, want %q", ok, st, detail, c.want)
			}
			if r.sets != 0 {
				t.Fatal("a rejected snapshot was partly applied")
			}
			if testutil.ToFloat64(a.m.nacks) != 1 {
				t.Fatal("nack not counted")
			}
		})
	}
	// A NACK names every ep_idx's expected ep_addr.
	a, _, clk := newApplier(t, Config{})
	s := snap(clk, "b", 1)
	s.Services[0].Eps[0].EpAddr = "10.0.0.99:8000"
	_, detail, _ := a.Handle(s)
	if !strings.Contains(detail, "0=10.0.0.11:8000, 1=10.0.0.12:8000") {
		t.Fatalf("detail %q does not list the expected addresses", detail)
	}
}

func TestStates(t *testing.T) {
	a, r, c := newApplier(t, Config{})
	s := snap(c, "b", 1)
	s.Services[0].Eps[0].State = pb.EpState_EP_STATE_DRAINING
	s.Services[0].Eps[1].State = pb.EpState_EP_STATE_DISABLED
	r.down.Add(0)
	if st, d, _ := a.Handle(s); st != pb.AckStatus_ACK_STATUS_APPLIED {
		t.Fatal(d)
	}
	adv := r.get()
	if !adv.Draining.Has(0) || !adv.Disabled.Has(1) || adv.Draining.Has(1) {
		t.Fatalf("advice %+v", adv)
	}
	if testutil.ToFloat64(a.m.state.WithLabelValues(svcKey, "0")) != 2 || testutil.ToFloat64(a.m.overrides) != 1 {
		t.Fatal("state or override metric")
	}
	// Full state: a snapshot without the service drops its advice.
	s = snap(c, "b", 2)
	s.Services = nil
	a.Handle(s)
	if r.get() != nil {
		t.Fatal("absent service kept its advice")
	}
}

func TestHysteresis(t *testing.T) {
	a, r, c := newApplier(t, Config{Hysteresis: 10 * time.Second})
	a.Handle(snap(c, "b", 1))
	drain := func(epoch uint64) {
		s := snap(c, "b", epoch)
		s.Services[0].Eps[1].State = pb.EpState_EP_STATE_DRAINING
		a.Handle(s)
	}
	drain(2)
	if r.get().Draining.Has(1) {
		t.Fatal("state changed before the hysteresis window")
	}
	c.t = c.t.Add(5 * time.Second)
	drain(3)
	if r.get().Draining.Has(1) {
		t.Fatal("state changed before the hysteresis window")
	}
	c.t = c.t.Add(5 * time.Second)
	drain(4)
	if !r.get().Draining.Has(1) {
		t.Fatal("state did not change after the hysteresis window")
	}
}

func TestStalenessDeadline(t *testing.T) {
	cases := []struct {
		name  string
		decay time.Duration
		// weight of ep 1 (advised 40) at deadline + 0, +5 s, +10 s; -1 means static
		want [3]int
	}{
		{"drop at once", 0, [3]int{-1, -1, -1}},
		{"decay over 10 s", 10 * time.Second, [3]int{40, 70, -1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, r, c := newApplier(t, Config{DecayWindow: tc.decay})
			s := snap(c, "b", 1)
			s.Services[0].Eps[0].State = pb.EpState_EP_STATE_DRAINING
			a.Handle(s)
			c.t = c.t.Add(29 * time.Second)
			a.Tick()
			if a.Mode() != ModeAdvised || r.get() == nil {
				t.Fatal("dropped before the deadline")
			}
			for i, want := range tc.want {
				c.t = time.UnixMilli(int64(s.StalenessDeadlineUnixMs)).Add(time.Duration(i) * 5 * time.Second)
				a.Tick()
				adv := r.get()
				if want < 0 {
					if adv != nil || a.Mode() != ModeStatic || testutil.ToFloat64(a.m.weight.WithLabelValues(svcKey, "1")) != 100 {
						t.Fatalf("step %d: advice %+v mode %d, want static", i, adv, a.Mode())
					}
					continue
				}
				if adv == nil || adv.Weight[1] != want || !adv.Draining.Empty() || a.Mode() != ModeDecaying {
					t.Fatalf("step %d: advice %+v mode %d, want weight %d and no draining", i, adv, a.Mode(), want)
				}
			}
			// A fresh snapshot after the drop applies again.
			a.Handle(snap(c, "b", 2))
			if r.get() == nil || a.Mode() != ModeAdvised {
				t.Fatal("not re-applied")
			}
		})
	}
}

func TestConfigFromEnv(t *testing.T) {
	env := func(kv ...string) func(string) string {
		m := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	if _, ok, err := ConfigFromEnv(env()); ok || err != nil {
		t.Fatal("unset must mean off")
	}
	c, ok, err := ConfigFromEnv(env("LOXILB_AI_CTRL_ADDR", "127.0.0.1:18856", "LOXILB_AI_CTRL_DECAY_WINDOW_SEC", "30",
		"LOXILB_AI_CTRL_HYSTERESIS_SEC", "5", "LOXILB_AI_CTRL_ACK_TIMEOUT_SEC", "2", "LOXILB_AI_CTRL_APPLY_JITTER_PCT", "10"))
	if !ok || err != nil || c.DecayWindow != 30*time.Second || c.Hysteresis != 5*time.Second || c.AckTimeout != 2*time.Second || c.JitterPct != 10 {
		t.Fatalf("%+v %v %v", c, ok, err)
	}
	bad := []struct{ k, v, want string }{
		{"LOXILB_AI_CTRL_ADDR", "nohostport", "LOXILB_AI_CTRL_ADDR"},
		{"LOXILB_AI_CTRL_ADDR", "10.1.2.3:18856", "beyond loopback"},
		{"LOXILB_AI_CTRL_DECAY_WINDOW_SEC", "-1", "LOXILB_AI_CTRL_DECAY_WINDOW_SEC"},
		{"LOXILB_AI_CTRL_HYSTERESIS_SEC", "x", "LOXILB_AI_CTRL_HYSTERESIS_SEC"},
		{"LOXILB_AI_CTRL_ACK_TIMEOUT_SEC", "0", "LOXILB_AI_CTRL_ACK_TIMEOUT_SEC"},
		{"LOXILB_AI_CTRL_APPLY_JITTER_PCT", "101", "LOXILB_AI_CTRL_APPLY_JITTER_PCT"},
		{"LOXILB_AI_CTRL_INSECURE", "yes", "LOXILB_AI_CTRL_INSECURE"},
		{"LOXILB_AI_CTRL_TLS_CA", "/nonexistent/ca.pem", "no such file"},
	}
	for _, b := range bad {
		e := map[string]string{"LOXILB_AI_CTRL_ADDR": "127.0.0.1:18856", b.k: b.v}
		_, _, err := ConfigFromEnv(func(k string) string { return e[k] })
		if err == nil || !strings.Contains(err.Error(), b.want) {
			t.Fatalf("%s=%s: err %v want %q", b.k, b.v, err, b.want)
		}
	}
	if _, ok, err := ConfigFromEnv(env("LOXILB_AI_CTRL_ADDR", "10.1.2.3:18856", "LOXILB_AI_CTRL_INSECURE", "1")); !ok || err != nil {
		t.Fatalf("explicit insecure refused: %v", err)
	}
}

// Whatever bytes arrive as a snapshot, Handle answers without a panic and a
// rejected snapshot changes nothing.
func FuzzHandle(f *testing.F) {
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	good, _ := proto.Marshal(snap(c, "b", 1))
	f.Add(good)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		var s pb.Snapshot
		if proto.Unmarshal(data, &s) != nil {
			return
		}
		a, r, _ := newApplier(t, Config{})
		st, _, ok := a.Handle(&s)
		if ok && st == pb.AckStatus_ACK_STATUS_REJECTED && r.sets != 0 {
			t.Fatal("rejected snapshot partly applied")
		}
	})
}
