package harness

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// PickRequest is what a baseline policy sees of a request.
type PickRequest struct {
	Path string
	Body []byte
	Text string // the routing text: the prompt, or the chat's message contents joined by spaces
}

// Policy is a baseline router behind the bench proxy. Pick returns an
// endpoint index; Done is called once per Pick when the response ends.
type Policy interface {
	Name() string
	Pick(r *PickRequest) int
	Done(i int)
	Close()
}

// maxBody bounds a proxied request body (enginesim's own default bound).
const maxBody = 8 << 20

// Proxy is one userspace HTTP hop in front of the fleet, like kvgate's, so
// every policy pays the same hop: it reads the request, asks the policy,
// forwards it and streams the response back chunk by chunk.
type Proxy struct {
	policy    Policy
	endpoints []string // base URLs
	client    *http.Client
	srv       *http.Server
	ln        net.Listener
	log       *slog.Logger
}

// StartProxy listens on host:0 and serves until Close.
func StartProxy(host string, endpoints []string, p Policy, log *slog.Logger) (*Proxy, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return nil, fmt.Errorf("bench proxy: %w", err)
	}
	px := &Proxy{policy: p, endpoints: endpoints, ln: ln, log: log,
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, IdleConnTimeout: 30 * time.Second,
			ResponseHeaderTimeout: 5 * time.Minute}}}
	px.srv = &http.Server{Handler: px, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = px.srv.Serve(ln) }()
	return px, nil
}

// URL is the proxy's base URL.
func (px *Proxy) URL() string { return "http://" + px.ln.Addr().String() }

// Close stops the proxy and the policy.
func (px *Proxy) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = px.srv.Shutdown(ctx)
	px.policy.Close()
}

func (px *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil || len(body) > maxBody {
		http.Error(w, `{"error":"request body unreadable or over 8 MiB"}`, http.StatusRequestEntityTooLarge)
		return
	}
	i := px.policy.Pick(&PickRequest{Path: r.URL.Path, Body: body, Text: routingText(r.URL.Path, body)})
	defer px.policy.Done(i)
	out, err := http.NewRequestWithContext(r.Context(), r.Method, px.endpoints[i]+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		http.Error(w, `{"error":"bad upstream request"}`, http.StatusBadGateway)
		return
	}
	out.Header = r.Header.Clone()
	resp, err := px.client.Do(out)
	if err != nil {
		http.Error(w, fmt.Sprintf(`{"error":%q}`, err.Error()), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	f, _ := w.(http.Flusher)
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			if f != nil {
				f.Flush()
			}
		}
		if err != nil {
			return
		}
	}
}

// routingText is the text an approximate router keys on: the completion
// prompt, or the contents of a chat's messages joined by spaces (the SGLang
// router's extract_text_for_routing for chat requests).
func routingText(path string, body []byte) string {
	var req struct {
		Prompt   json.RawMessage `json:"prompt"`
		Messages []struct {
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	if json.Unmarshal(body, &req) != nil {
		return ""
	}
	if path == PathCompletion {
		var s string
		if json.Unmarshal(req.Prompt, &s) == nil {
			return s
		}
		return ""
	}
	parts := make([]string, 0, len(req.Messages))
	for _, m := range req.Messages {
		var s string
		if json.Unmarshal(m.Content, &s) == nil {
			parts = append(parts, s)
		}
	}
	return strings.Join(parts, " ")
}

// roundRobin cycles through the endpoints.
type roundRobin struct {
	n    int
	next atomic.Uint64
}

func (p *roundRobin) Name() string { return "round-robin" }
func (p *roundRobin) Pick(*PickRequest) int {
	return int((p.next.Add(1) - 1) % uint64(p.n))
}
func (p *roundRobin) Done(int) {}
func (p *roundRobin) Close()   {}

// leastInflight picks the endpoint with the fewest requests this proxy has
// in flight; ties go round-robin so an idle fleet still spreads.
type leastInflight struct {
	mu       sync.Mutex
	inflight []int
	cursor   int
}

func (p *leastInflight) Name() string { return "least-inflight" }
func (p *leastInflight) Pick(*PickRequest) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.inflight)
	best := -1
	for k := 0; k < n; k++ {
		i := (p.cursor + k) % n
		if best < 0 || p.inflight[i] < p.inflight[best] {
			best = i
		}
	}
	p.cursor = (best + 1) % n
	p.inflight[best]++
	return best
}
func (p *leastInflight) Done(i int) { p.mu.Lock(); p.inflight[i]--; p.mu.Unlock() }
func (p *leastInflight) Close()     {}

// leastLoad picks the lowest vllm:num_requests_running +
// vllm:num_requests_waiting scraped from each engine's /metrics, the signal
// a metrics-driven scheduler (llm-d's queue scorer, a Prometheus-fed
// balancer) has. Samples are as fresh as the scrape interval; ties go
// round-robin.
type leastLoad struct {
	urls   []string
	client *http.Client
	mu     sync.Mutex
	load   []float64
	cursor int
	stop   chan struct{}
	once   sync.Once
}

// LeastLoadScrapeInterval is how often leastLoad reads the engines' metrics.
const LeastLoadScrapeInterval = 50 * time.Millisecond

func newLeastLoad(urls []string) *leastLoad {
	p := &leastLoad{urls: urls, client: &http.Client{Timeout: 2 * time.Second}, load: make([]float64, len(urls)), stop: make(chan struct{})}
	go p.loop()
	return p
}

func (p *leastLoad) Name() string { return "least-load" }
func (p *leastLoad) loop() {
	t := time.NewTicker(LeastLoadScrapeInterval)
	defer t.Stop()
	for {
		for i, u := range p.urls {
			if v, err := scrapeQueue(p.client, u); err == nil {
				p.mu.Lock()
				p.load[i] = v
				p.mu.Unlock()
			}
		}
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
	}
}

func (p *leastLoad) Pick(*PickRequest) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.load)
	best := -1
	for k := 0; k < n; k++ {
		i := (p.cursor + k) % n
		if best < 0 || p.load[i] < p.load[best] {
			best = i
		}
	}
	p.cursor = (best + 1) % n
	return best
}
func (p *leastLoad) Done(int) {}
func (p *leastLoad) Close()   { p.once.Do(func() { close(p.stop) }) }

// scrapeQueue sums vllm:num_requests_running and vllm:num_requests_waiting.
func scrapeQueue(c *http.Client, base string) (float64, error) {
	resp, err := c.Get(base + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 4<<20))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "vllm:num_requests_running") && !strings.HasPrefix(line, "vllm:num_requests_waiting") {
			continue
		}
		if sp := strings.LastIndexByte(line, ' '); sp > 0 {
			if v, err := strconv.ParseFloat(line[sp+1:], 64); err == nil {
				sum += v
			}
		}
	}
	return sum, sc.Err()
}
