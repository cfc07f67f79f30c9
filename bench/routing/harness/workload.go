package harness

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"time"
)

// Model is the served model name; the committed Qwen3 tokenizer tokenizes it.
const Model = "Qwen/Qwen3-0.6B"

// Paths the harness sends to.
const (
	PathChat       = "/v1/chat/completions"
	PathCompletion = "/v1/completions"
)

// Request is one recorded request of a trace. Conv ≥ 0 groups the turns of
// one conversation: turn k is sent only after turn k−1 has finished, so a
// turn never races ahead of the history it extends.
type Request struct {
	Seq       int
	At        time.Duration // open-loop arrival offset from the start of the point
	Conv      int           // −1: independent request
	Turn      int
	Path      string
	Body      []byte
	MaxTokens int
	Kind      string // which part of the workload it came from (mixed keeps them apart)
}

// Shape sizes one workload. The defaults (ShapeFor) are scaled so that one
// point runs in seconds on a shared 2-core machine; see
// docs/routing-benchmark.md for the scaling argument.
type Shape struct {
	Requests int // requests per point

	// capacity: Groups × PerGroup prompts, each a SystemWords prefix shared by
	// its group plus a QuestionWords question (llm-d's shared_prefix shape).
	Groups, SystemWords, QuestionWords int

	// chat: conversations of Turns turns, UserWords per user turn and
	// AssistantWords per (synthetic) assistant turn; ActiveConvs run at once.
	Turns, UserWords, AssistantWords, ActiveConvs int

	// herding: HotShare of the requests carry one HotWords system prompt.
	HotShare float64
	HotWords int

	// nosharing: UniqueWords per unique prompt.
	UniqueWords int

	MaxTokens int
}

// Workloads the harness knows, in report order.
func Workloads() []string { return []string{"capacity", "chat", "herding", "nosharing", "mixed"} }

// Generate builds the trace of workload w for one seed. Arrival offsets are
// left at zero; Poisson stamps them per offered load, so every policy at a
// point replays the same requests at the same instants.
func Generate(w string, s Shape, seed uint64) ([]Request, error) {
	rng := rand.New(rand.NewPCG(seed, seed^0x6a09e667f3bcc909))
	g := &gen{rng: rng, s: s}
	var out []Request
	switch w {
	case "capacity":
		out = g.capacity(s.Requests)
	case "chat":
		out = g.chat(s.Requests)
	case "herding":
		out = g.herding(s.Requests)
	case "nosharing":
		out = g.nosharing(s.Requests)
	case "mixed":
		// A quarter of each: the parts keep their own prefixes and
		// conversations, interleaved at random.
		n := s.Requests / 4
		parts := [][]Request{g.capacity(n), g.chat(n), g.herding(n), g.nosharing(s.Requests - 3*n)}
		out = interleave(rng, parts)
	default:
		return nil, fmt.Errorf("workload %q: want one of %s", w, strings.Join(Workloads(), ", "))
	}
	for i := range out {
		out[i].Seq = i
	}
	return out, nil
}

// Poisson returns a copy of trace with exponential inter-arrival gaps at
// qps requests per second (open loop), drawn from seed.
func Poisson(trace []Request, qps float64, seed uint64) []Request {
	rng := rand.New(rand.NewPCG(seed^0xbb67ae8584caa73b, seed))
	out := append([]Request(nil), trace...)
	var t float64
	for i := range out {
		out[i].At = time.Duration(t * float64(time.Second))
		t += -math.Log(1-rng.Float64()) / qps
	}
	return out
}

type gen struct {
	rng  *rand.Rand
	s    Shape
	conv int
}

func (g *gen) capacity(n int) []Request {
	groups := max(1, g.s.Groups)
	sys := make([]string, groups)
	for i := range sys {
		sys[i] = fmt.Sprintf("Customer %d policy handbook. ", i) + prose(g.rng, g.s.SystemWords)
	}
	out := make([]Request, 0, n)
	for i := 0; i < n; i++ {
		// Groups are drawn uniformly, so every group recurs and the working
		// set is all groups at once.
		p := sys[g.rng.IntN(groups)] + "\n\nQuestion: " + prose(g.rng, g.s.QuestionWords) + "?\nAnswer:"
		out = append(out, g.completion("capacity", p))
	}
	return out
}

func (g *gen) chat(n int) []Request {
	type conv struct {
		id, turn int
		msgs     []map[string]string
	}
	system := "You are a helpful assistant for a support desk. Keep answers short."
	var active []*conv
	newConv := func() *conv {
		c := &conv{id: g.conv, msgs: []map[string]string{{"role": "system", "content": system}}}
		g.conv++
		return c
	}
	for len(active) < max(1, g.s.ActiveConvs) {
		active = append(active, newConv())
	}
	out := make([]Request, 0, n)
	for len(out) < n {
		i := g.rng.IntN(len(active))
		c := active[i]
		c.msgs = append(c.msgs, map[string]string{"role": "user", "content": prose(g.rng, g.s.UserWords) + "?"})
		out = append(out, g.chatReq("chat", c.id, c.turn, c.msgs))
		c.msgs = append(c.msgs, map[string]string{"role": "assistant", "content": prose(g.rng, g.s.AssistantWords) + "."})
		c.turn++
		if c.turn >= max(1, g.s.Turns) {
			active[i] = newConv()
		}
	}
	return out
}

func (g *gen) herding(n int) []Request {
	hot := "You are the incident commander's assistant. Follow the runbook exactly. " + prose(g.rng, g.s.HotWords)
	out := make([]Request, 0, n)
	for i := 0; i < n; i++ {
		sys := hot
		if g.rng.Float64() >= g.s.HotShare {
			sys = fmt.Sprintf("Tenant %d. ", g.rng.Uint32()) + prose(g.rng, g.s.HotWords)
		}
		msgs := []map[string]string{{"role": "system", "content": sys}, {"role": "user", "content": prose(g.rng, g.s.QuestionWords) + "?"}}
		out = append(out, g.chatReq("herding", -1, 0, msgs))
	}
	return out
}

func (g *gen) nosharing(n int) []Request {
	out := make([]Request, 0, n)
	for i := 0; i < n; i++ {
		// The leading number makes even the first block unique.
		out = append(out, g.completion("nosharing", fmt.Sprintf("%d %d. ", g.rng.Uint64(), i)+prose(g.rng, g.s.UniqueWords)))
	}
	return out
}

func (g *gen) completion(kind, prompt string) Request {
	body, _ := json.Marshal(map[string]any{
		"model": Model, "prompt": prompt, "max_tokens": g.s.MaxTokens, "stream": true,
		"stream_options": map[string]any{"include_usage": true}, "ignore_eos": true,
	})
	return Request{Conv: -1, Path: PathCompletion, Body: body, MaxTokens: g.s.MaxTokens, Kind: kind}
}

func (g *gen) chatReq(kind string, conv, turn int, msgs []map[string]string) Request {
	body, _ := json.Marshal(map[string]any{
		"model": Model, "messages": msgs, "max_tokens": g.s.MaxTokens, "stream": true,
		"stream_options": map[string]any{"include_usage": true}, "ignore_eos": true,
	})
	return Request{Conv: conv, Turn: turn, Path: PathChat, Body: body, MaxTokens: g.s.MaxTokens, Kind: kind}
}

// interleave merges parts at random, keeping each part's order (so turns of
// a conversation stay in order).
func interleave(rng *rand.Rand, parts [][]Request) []Request {
	var out []Request
	idx := make([]int, len(parts))
	left := 0
	for _, p := range parts {
		left += len(p)
	}
	for ; left > 0; left-- {
		k := rng.IntN(left)
		for i, p := range parts {
			rem := len(p) - idx[i]
			if k < rem {
				out = append(out, p[idx[i]])
				idx[i]++
				break
			}
			k -= rem
		}
	}
	return out
}

// proseWords is the vocabulary of prose.
func proseWords() []string {
	return strings.Fields(`the cluster node queue latency request token cache block prefix engine worker
route balance shard replica memory budget window stream event batch sequence gap replay tensor prompt model
scheduler throughput capacity policy fleet region service gateway upstream response header status metric
label counter gauge histogram alert incident review deploy rollout canary config secret volume network
packet socket kernel splice buffer thread core mutex channel context deadline retry backoff circuit probe
invoice refund account order parcel warranty billing tariff contract ledger customer support ticket agent`)
}

func prose(rng *rand.Rand, n int) string {
	words := proseWords()
	var b strings.Builder
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(words[rng.IntN(len(words))])
	}
	return b.String()
}
