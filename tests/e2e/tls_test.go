package e2e

// TLS termination through the real kvgate binary (docs/security.md, "TLS
// termination on the data plane"): certificates generated here into
// --tls-cert-dir, a simulated vLLM engine, curl, the official OpenAI Node
// SDK, Go clients, and a TLS relay standing in for an engine that speaks
// https (security 2).

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/enginesim"
	"github.com/kvgate/kvgate/internal/syncbuf"
	"github.com/kvgate/kvgate/internal/testcerts"
	"github.com/kvgate/kvgate/internal/testnet"
)

// buildKvgate builds the daemon once per test binary.
func buildKvgate(t *testing.T) string {
	t.Helper()
	return filepath.Join(buildCommands(t, "kvgate"), "kvgate")
}

// tlsFixture is one kvgate daemon with TLS rules over one engine.
type tlsFixture struct {
	block   string
	api     string // http://host:port
	vip     string
	certDir string
	ca      *testcerts.CA
	caFile  string
	engine  *enginesim.Engine
	zmq     int
	logs    *syncbuf.Buffer
}

func startTLSFixture(t *testing.T) *tlsFixture {
	t.Helper()
	bin := buildKvgate(t)
	f := &tlsFixture{block: testnet.Block(t), certDir: t.TempDir(), logs: &syncbuf.Buffer{}}
	f.vip = f.block + "1"
	var err error
	if f.ca, err = testcerts.NewCA("kvgate e2e CA"); err != nil {
		t.Fatal(err)
	}
	f.caFile = filepath.Join(t.TempDir(), "ca.crt")
	if err := f.ca.WriteCA(f.caFile); err != nil {
		t.Fatal(err)
	}
	engines, zmq := startEngines(t, f.block, []engineSpec{{role: enginesim.RoleBoth}})
	f.engine, f.zmq = engines[0], zmq
	api := fmt.Sprintf("%s2:%d", f.block, testnet.Port(t, f.block+"2"))
	cmd := exec.Command(bin, "--api", api, "--state-dir", t.TempDir(), "--tokenizer-dir", stagingDir(t), "--decision-header",
		"--tls-cert-dir", f.certDir, "--tls-reload-interval", "200ms", "--tls-handshake-timeout", "1s", "--shutdown-grace", "2s")
	cmd.Env = append(os.Environ(), "LLB_KV_NONE_HASH_SEED=0")
	cmd.Stderr = f.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("kvgate log:\n%s", f.logs.String())
		}
	})
	f.api = "http://" + api
	waitFor(t, "the management API", 20*time.Second, func() bool {
		resp, err := http.Get(f.api + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	})
	return f
}

// certify writes a server certificate (CN cn) for the VIP and kvgate.test
// into the rule's directory.
func (f *tlsFixture) certify(t *testing.T, port int, cn string) {
	t.Helper()
	p, err := f.ca.Server(cn, f.vip, "kvgate.test")
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Write(filepath.Join(f.certDir, fmt.Sprintf("%s_%d", f.vip, port))); err != nil {
		t.Fatal(err)
	}
}

// post sends a rule; it returns the status and the body.
func (f *tlsFixture) post(t *testing.T, args map[string]any, endpoints ...string) (int, string) {
	t.Helper()
	a := map[string]any{"externalIP": f.vip, "protocol": "tcp", "sel": 0, "mode": 4}
	for k, v := range args {
		a[k] = v
	}
	var eps []map[string]any
	for _, e := range endpoints {
		h, p, _ := net.SplitHostPort(e)
		n, _ := strconv.Atoi(p)
		eps = append(eps, map[string]any{"endpointIP": h, "targetPort": n, "weight": 1})
	}
	b, _ := json.Marshal(map[string]any{"serviceArguments": a, "endpoints": eps})
	resp, err := http.Post(f.api+"/netlox/v1/config/loadbalancer", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// rule creates a rule and returns its service_id.
func (f *tlsFixture) rule(t *testing.T, args map[string]any, endpoints ...string) int {
	t.Helper()
	status, body := f.post(t, args, endpoints...)
	var out struct {
		ServiceID int `json:"service_id"`
	}
	if status != 200 || json.Unmarshal([]byte(body), &out) != nil {
		t.Fatalf("create rule %v: %d %s", args, status, body)
	}
	return out.ServiceID
}

func (f *tlsFixture) metric(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	return scrapeSum(t, f.api+"/netlox/v1/metrics", name, labels)
}

func (f *tlsFixture) engineAddr(t *testing.T) string {
	h, p := engineHostPort(t, f.engine)
	return net.JoinHostPort(h, strconv.Itoa(p))
}

func (f *tlsFixture) client(cfg *tls.Config) *http.Client {
	if cfg == nil {
		cfg = &tls.Config{}
	}
	if cfg.RootCAs == nil {
		cfg.RootCAs = f.ca.Pool()
	}
	return &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}}
}

func getStatus(c *http.Client, url string) (int, *tls.ConnectionState, error) {
	resp, err := c.Get(url)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.TLS, nil
}

// TestTLSTermination: security 1 and 2 rules through the real daemon.
func TestTLSTermination(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the kvgate binary")
	}
	f := startTLSFixture(t)
	kv := map[string]any{"kvExactMode": 3, "kvZmqPort": f.zmq, "kvHashAlgo": "sha256_cbor", "kvBlockSize": 16}
	with := func(m map[string]any, extra map[string]any) map[string]any {
		out := map[string]any{}
		for k, v := range m {
			out[k] = v
		}
		for k, v := range extra {
			out[k] = v
		}
		return out
	}
	portTLS, portPlain := testnet.Port(t, f.vip), testnet.Port(t, f.vip)
	f.certify(t, portTLS, "first")
	idTLS := f.rule(t, with(kv, map[string]any{"port": portTLS, "security": 1}), f.engineAddr(t))
	idPlain := f.rule(t, with(kv, map[string]any{"port": portPlain}), f.engineAddr(t))
	for _, id := range []int{idTLS, idPlain} {
		waitFor(t, "KV subscribers", 10*time.Second, func() bool {
			return f.metric(t, "loxilb_kv_subscriber_connected", map[string]string{"service": strconv.Itoa(id)}) == 1
		})
	}
	time.Sleep(200 * time.Millisecond) // ZeroMQ subscriptions settle after the connect
	base := fmt.Sprintf("https://%s:%d", f.vip, portTLS)

	t.Run("refusals", func(t *testing.T) { testTLSRefusals(t, f) })
	t.Run("curl", func(t *testing.T) { testTLSCurl(t, f, portTLS) })
	t.Run("X-Forwarded-Proto", func(t *testing.T) { testForwardedProto(t, f) })
	t.Run("streams byte-identical", func(t *testing.T) { testTLSStreamsIdentical(t, f, portTLS, portPlain) })
	t.Run("openai node SDK with warm hits", func(t *testing.T) { testTLSNodeSDK(t, f, base) })
	t.Run("mTLS required", func(t *testing.T) { testTLSClientCerts(t, f) })
	t.Run("bad handshakes", func(t *testing.T) { testTLSBadInput(t, f, portTLS, idTLS) })
	t.Run("rotation under load", func(t *testing.T) { testTLSRotation(t, f, portTLS, base) })
	t.Run("body leg", func(t *testing.T) {
		if v := f.metric(t, "kvgate_rule_datapath_info", map[string]string{"service": strconv.Itoa(idTLS), "path": "userspace", "reason": "tls"}); v != 1 {
			t.Errorf("TLS rule: kvgate_rule_datapath_info{path=userspace,reason=tls} = %v", v)
		}
		if v := f.metric(t, "kvgate_rule_datapath_info", map[string]string{"service": strconv.Itoa(idPlain), "reason": "datapath"}); v != 1 {
			t.Errorf("plain rule: kvgate_rule_datapath_info{reason=datapath} = %v", v)
		}
		if !strings.Contains(f.logs.String(), "TLS rule: the sockmap cannot move TLS records") {
			t.Error("the TLS rule's body-leg choice is not logged")
		}
		// A token stream over TLS moves no byte through the kernel splice,
		// whatever --datapath chose (auto splices token streams when BPF
		// is available).
		spliced := func() float64 { return f.metric(t, "kvgate_spliced_bytes_total", map[string]string{"path": "sockmap"}) }
		before := spliced()
		tc, err := tls.Dial("tcp", net.JoinHostPort(f.vip, strconv.Itoa(portTLS)), &tls.Config{RootCAs: f.ca.Pool(), ServerName: f.vip})
		if err != nil {
			t.Fatal(err)
		}
		body := rawStream(t, tc, "/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":"no splice for TLS","max_tokens":16,"stream":true}`, model))
		if !bytes.Contains(body, []byte("data: [DONE]")) {
			t.Fatalf("TLS stream incomplete: %q", body)
		}
		if after := spliced(); after != before {
			t.Errorf("a TLS stream moved %v bytes through the sockmap", after-before)
		}
	})
	t.Run("e2ehttps", func(t *testing.T) { testE2EHTTPS(t, f) })
	t.Run("P/D over TLS", func(t *testing.T) { testTLSPD(t, f) })
}

// testTLSPD: a mode-1 P/D rule behind TLS: the two-leg flow answers a TLS
// client, the decode leg streaming through the userspace copy.
func testTLSPD(t *testing.T, f *tlsFixture) {
	engines, zmq := startEngines(t, testnet.Block(t), []engineSpec{{role: enginesim.RolePrefill}, {role: enginesim.RoleDecode}})
	port := testnet.Port(t, f.vip)
	f.certify(t, port, "pd")
	body := ruleJSON(t, f.vip, port, map[string]any{"kvExactMode": 1, "kvZmqPort": zmq, "kvHashAlgo": "sha256_cbor", "kvBlockSize": 16, "security": 1},
		engines, []int{1, 2})
	resp, err := http.Post(f.api+"/netlox/v1/config/loadbalancer", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("P/D TLS rule: %d %s", resp.StatusCode, b)
	}
	c := f.client(nil)
	req := fmt.Sprintf(`{"model":%q,"prompt":"prefill then decode, over TLS","max_tokens":12,"stream":true}`, model)
	waitFor(t, "the P/D rule to serve", 10*time.Second, func() bool {
		r, err := c.Post(fmt.Sprintf("https://%s:%d/v1/completions", f.vip, port), "application/json", strings.NewReader(req))
		if err != nil {
			return false
		}
		defer r.Body.Close()
		out, err := io.ReadAll(r.Body)
		return err == nil && r.StatusCode == 200 && r.Header.Get("x-engine-id") == "engine-1" &&
			decisionField(r.Header.Get("x-kvgate-decision"), "decode") == "1" && bytes.Contains(out, []byte("data: [DONE]"))
	})
}

func testTLSRefusals(t *testing.T, f *tlsFixture) {
	port := testnet.Port(t, f.vip)
	dir := filepath.Join(f.certDir, fmt.Sprintf("%s_%d", f.vip, port))
	cases := []struct {
		name  string
		args  map[string]any
		words []string
	}{
		{"no certificate", map[string]any{"port": port, "security": 1}, []string{"serviceArguments.security", filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")}},
		{"security 3", map[string]any{"port": port, "security": 3}, []string{"serviceArguments.security", "0 plain HTTP"}},
		{"client_cert_mode require", map[string]any{"port": port, "security": 1, "mtls_frontend": map[string]any{"client_cert_mode": "require", "client_ca_path": f.caFile}},
			[]string{"serviceArguments.mtls_frontend.client_cert_mode", "disabled, optional, required"}},
	}
	for _, c := range cases {
		status, body := f.post(t, c.args, f.engineAddr(t))
		if status != 400 {
			t.Errorf("%s: status %d, want 400: %s", c.name, status, body)
			continue
		}
		for _, w := range c.words {
			if !strings.Contains(body, w) {
				t.Errorf("%s: the 400 does not name %q: %s", c.name, w, body)
			}
		}
	}
}

func testTLSCurl(t *testing.T, f *tlsFixture, port int) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl not installed")
	}
	url := fmt.Sprintf("https://%s:%d/v1/models", f.vip, port)
	sni := fmt.Sprintf("https://kvgate.test:%d/v1/models", port)
	resolve := fmt.Sprintf("kvgate.test:%d:%s", port, f.vip)
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"--cacert", []string{"--cacert", f.caFile, url}, "200"},
		{"SNI name", []string{"--cacert", f.caFile, "--resolve", resolve, sni}, "200"},
		{"TLS 1.3 only", []string{"--cacert", f.caFile, "--tlsv1.3", url}, "200"},
		{"TLS 1.2 max", []string{"--cacert", f.caFile, "--tls-max", "1.2", url}, "200"},
	}
	for _, c := range cases {
		out, err := exec.Command("curl", append([]string{"-s", "-o", "/dev/null", "-w", "%{http_code}"}, c.args...)...).CombinedOutput()
		if err != nil || string(out) != c.want {
			t.Errorf("%s: curl answered %q (%v), want %s", c.name, out, err, c.want)
		}
	}
	if out, err := exec.Command("curl", "-s", url).CombinedOutput(); err == nil {
		t.Errorf("curl without --cacert trusted the test CA: %s", out)
	}
}

// testForwardedProto: the engine behind a TLS rule sees exactly one
// X-Forwarded-Proto, https, whatever the client sent.
func testForwardedProto(t *testing.T, f *tlsFixture) {
	var mu sync.Mutex
	var seen [][]string
	ln, err := net.Listen("tcp", f.block+"31:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Values("X-Forwarded-Proto"))
		mu.Unlock()
		_, _ = io.WriteString(w, "ok")
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	port := testnet.Port(t, f.vip)
	f.certify(t, port, "headers")
	f.rule(t, map[string]any{"port": port, "security": 1}, ln.Addr().String())
	c := f.client(nil)
	for _, sent := range []string{"", "http"} {
		req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("https://%s:%d/", f.vip, port), nil)
		if sent != "" {
			req.Header.Set("X-Forwarded-Proto", sent)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 2 {
		t.Fatalf("backend saw %d requests", len(seen))
	}
	for i, v := range seen {
		if len(v) != 1 || v[0] != "https" {
			t.Errorf("request %d: backend saw X-Forwarded-Proto %q, want exactly [https]", i, v)
		}
	}
}

var createdField = regexp.MustCompile(`"created":\d+`)

// rawStream sends one request on conn with Connection: close and returns
// the de-chunked body.
func rawStream(t *testing.T, conn net.Conn, path, body string) []byte {
	t.Helper()
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	req := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: kvgate\r\nContent-Type: application/json\r\nX-Request-Id: tls-identical\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s",
		path, len(body), body)
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 || len(resp.TransferEncoding) == 0 {
		t.Fatalf("status %d, transfer-encoding %v, body %q, err %v", resp.StatusCode, resp.TransferEncoding, b, err)
	}
	return createdField.ReplaceAll(b, []byte(`"created":0`))
}

// testTLSStreamsIdentical: the same streams through the same engine over a
// TLS rule and a plain rule carry the same bytes (the response's creation
// second aside).
func testTLSStreamsIdentical(t *testing.T, f *tlsFixture, portTLS, portPlain int) {
	bodies := map[string]string{
		"/v1/chat/completions": fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"Stream a few words over TLS, please."}],"max_tokens":24,"stream":true}`, model),
		"/v1/completions":      fmt.Sprintf(`{"model":%q,"prompt":"The identical stream test says","max_tokens":24,"stream":true}`, model),
	}
	for path, body := range bodies {
		tc, err := tls.Dial("tcp", net.JoinHostPort(f.vip, strconv.Itoa(portTLS)), &tls.Config{RootCAs: f.ca.Pool(), ServerName: f.vip})
		if err != nil {
			t.Fatal(err)
		}
		overTLS := rawStream(t, tc, path, body)
		pc, err := net.Dial("tcp", net.JoinHostPort(f.vip, strconv.Itoa(portPlain)))
		if err != nil {
			t.Fatal(err)
		}
		plain := rawStream(t, pc, path, body)
		if !bytes.Equal(overTLS, plain) || bytes.Count(plain, []byte("data: ")) < 10 {
			t.Errorf("%s: TLS and plain streams differ (or are short):\nTLS:   %q\nplain: %q", path, overTLS, plain)
		}
	}
}

func testTLSNodeSDK(t *testing.T, f *tlsFixture, base string) {
	node, err := exec.LookPath("node")
	_, modErr := os.Stat("node/node_modules/openai/package.json")
	if err != nil || modErr != nil {
		if os.Getenv("KVGATE_REQUIRE_NODE") != "" {
			t.Fatalf("KVGATE_REQUIRE_NODE is set but node (%v) or node/node_modules/openai (%v) is missing; run npm ci in tests/e2e/node", err, modErr)
		}
		t.Skip("node or tests/e2e/node/node_modules missing (npm ci in tests/e2e/node)")
	}
	cmd := exec.Command(node, "tls.mjs", base+"/v1", model)
	cmd.Dir = "node"
	cmd.Env = append(os.Environ(), "NODE_EXTRA_CA_CERTS="+f.caFile)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, stderr.String())
	}
	var runs []struct {
		Chunks   int    `json:"chunks"`
		Text     string `json:"text"`
		Decision string `json:"decision"`
		Usage    *struct {
			PromptTokens int `json:"prompt_tokens"`
			Details      *struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(out, &runs); err != nil || len(runs) != 2 {
		t.Fatalf("node output %q: %v", out, err)
	}
	for i, r := range runs {
		if r.Chunks < 2 || r.Text == "" || r.Usage == nil || r.Usage.PromptTokens < 32 || r.Decision == "" {
			t.Fatalf("run %d over https: %+v", i, r)
		}
	}
	warm := runs[1]
	if warm.Usage.Details == nil || warm.Usage.Details.CachedTokens == 0 || decisionField(warm.Decision, "tier") != "1.5" {
		t.Fatalf("the second request over https is not a warm KV hit: decision %q usage %+v", warm.Decision, warm.Usage)
	}
}

// testTLSClientCerts: client_cert_mode required refuses a client without a
// certificate (counted) and serves one with a certificate from the CA.
func testTLSClientCerts(t *testing.T, f *tlsFixture) {
	port := testnet.Port(t, f.vip)
	f.certify(t, port, "mtls")
	clients, err := testcerts.NewCA("clients CA")
	if err != nil {
		t.Fatal(err)
	}
	clientsFile := filepath.Join(t.TempDir(), "clients.crt")
	if err := clients.WriteCA(clientsFile); err != nil {
		t.Fatal(err)
	}
	id := f.rule(t, map[string]any{"port": port, "security": 1, "mtls_frontend": map[string]any{"client_cert_mode": "required", "client_ca_path": clientsFile}}, f.engineAddr(t))
	url := fmt.Sprintf("https://%s:%d/v1/models", f.vip, port)
	if _, _, err := getStatus(f.client(nil), url); err == nil {
		t.Fatal("a client without a certificate was served")
	}
	pair, err := clients.Client("operator")
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := pair.TLS()
	if st, _, err := getStatus(f.client(&tls.Config{Certificates: []tls.Certificate{cert}}), url); err != nil || st != 200 {
		t.Fatalf("a client with a certificate: %d %v", st, err)
	}
	waitFor(t, "the refused handshake counted", 5*time.Second, func() bool {
		return f.metric(t, "kvgate_tls_handshake_errors_total", map[string]string{"service": strconv.Itoa(id), "reason": "client_cert"}) >= 1
	})
}

// testTLSBadInput: a silent client, plain HTTP, an oversize ClientHello and
// garbage on the TLS port are each closed (plain HTTP with a 400) and
// counted, while a well-behaved client is served meanwhile.
func testTLSBadInput(t *testing.T, f *tlsFixture, port, id int) {
	addr := net.JoinHostPort(f.vip, strconv.Itoa(port))
	cases := []struct {
		reason string
		send   []byte
		answer string
	}{
		{"timeout", nil, ""},
		{"plain_http", []byte("GET /v1/models HTTP/1.1\r\nHost: kvgate\r\n\r\n"), "HTTP/1.1 400 Bad Request"},
		{"oversize", []byte{0x16, 0x03, 0x01, 0x00, 0x04, 0x01, 0x0f, 0xff, 0xff}, ""},
		{"bad_record", []byte("\x00\x01garbage-not-tls"), ""},
	}
	good := f.client(nil)
	for _, c := range cases {
		before := f.metric(t, "kvgate_tls_handshake_errors_total", map[string]string{"service": strconv.Itoa(id), "reason": c.reason})
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := nc.Write(c.send); err != nil {
			t.Fatal(err)
		}
		if st, _, err := getStatus(good, "https://"+addr+"/v1/models"); err != nil || st != 200 {
			t.Errorf("%s: a concurrent good client failed: %d %v", c.reason, st, err)
		}
		_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		got, err := io.ReadAll(nc)
		nc.Close()
		if err != nil {
			t.Errorf("%s: the connection was not closed: %v", c.reason, err)
		}
		if !strings.HasPrefix(string(got), c.answer) {
			t.Errorf("%s: answer %q, want prefix %q", c.reason, got, c.answer)
		}
		waitFor(t, c.reason+" counted", 5*time.Second, func() bool {
			return f.metric(t, "kvgate_tls_handshake_errors_total", map[string]string{"service": strconv.Itoa(id), "reason": c.reason}) == before+1
		})
	}
}

// testTLSRotation: a loop of requests, each on a new connection, while the
// certificate and key are replaced: no request fails, and the new
// certificate is served afterwards; a keep-alive connection opened before
// the rotation keeps working on the old one.
func testTLSRotation(t *testing.T, f *tlsFixture, port int, base string) {
	keep := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: f.ca.Pool()}}}
	if st, _, err := getStatus(keep, base+"/v1/models"); err != nil || st != 200 {
		t.Fatalf("keep-alive client: %d %v", st, err)
	}
	var failed, served atomic.Int64
	var rotatedSeen atomic.Bool
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := f.client(nil)
			for ctx.Err() == nil {
				st, cs, err := getStatus(c, base+"/v1/models")
				if err != nil || st != 200 {
					failed.Add(1)
					t.Errorf("request during rotation: %d %v", st, err)
					continue
				}
				served.Add(1)
				if cs.PeerCertificates[0].Subject.CommonName == "rotated" {
					rotatedSeen.Store(true)
				}
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	f.certify(t, port, "rotated")
	waitFor(t, "the rotated certificate served", 10*time.Second, rotatedSeen.Load)
	time.Sleep(300 * time.Millisecond)
	cancel()
	wg.Wait()
	if failed.Load() != 0 || served.Load() < 4 {
		t.Fatalf("%d requests failed, %d served during the rotation", failed.Load(), served.Load())
	}
	if st, cs, err := getStatus(keep, base+"/v1/models"); err != nil || st != 200 || cs.PeerCertificates[0].Subject.CommonName != "first" {
		t.Fatalf("the keep-alive connection from before the rotation: %d %v", st, err)
	}
}

// tlsRelay is an engine that speaks https: TLS in front of enginesim's port.
// open counts its TLS connections not yet closed by either side.
type tlsRelay struct {
	addr               string
	handshakes, resume atomic.Int64
	open               atomic.Int64

	mu    sync.Mutex
	conns map[*tls.Conn]struct{}
}

// closeAll closes every connection, as an engine whose keep-alive timeout
// ran out (or that restarted) does.
func (r *tlsRelay) closeAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for c := range r.conns {
		_ = c.Close()
	}
}

func startTLSRelay(t *testing.T, host, target string, cert tls.Certificate) *tlsRelay {
	t.Helper()
	r := &tlsRelay{conns: map[*tls.Conn]struct{}{}}
	ln, err := tls.Listen("tcp", host+":0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	r.addr = ln.Addr().String()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go r.relay(c.(*tls.Conn), target)
		}
	}()
	return r
}

func (r *tlsRelay) relay(c *tls.Conn, target string) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if c.Handshake() != nil {
		return
	}
	r.open.Add(1)
	defer r.open.Add(-1)
	r.mu.Lock()
	r.conns[c] = struct{}{}
	r.mu.Unlock()
	defer func() { r.mu.Lock(); delete(r.conns, c); r.mu.Unlock() }()
	r.handshakes.Add(1)
	if c.ConnectionState().DidResume {
		r.resume.Add(1)
	}
	b, err := net.Dial("tcp", target)
	if err != nil {
		return
	}
	defer b.Close()
	go func() { _, _ = io.Copy(b, c); _ = b.Close() }() // kvgate closing ends the engine's side too
	_, _ = io.Copy(c, b)
}

// testE2EHTTPS: security 2 verifies the engine's certificate against
// backend_ca_path, refuses an engine whose certificate another CA signed,
// and keeps its engine connections in a pool: sequential requests share
// one TLS connection, one the engine closed is replaced (resuming the TLS
// session), and deleting the rule closes the idle one.
func testE2EHTTPS(t *testing.T, f *tlsFixture) {
	engineCA, err := testcerts.NewCA("engines CA")
	if err != nil {
		t.Fatal(err)
	}
	engineCAFile := filepath.Join(t.TempDir(), "engines.crt")
	if err := engineCA.WriteCA(engineCAFile); err != nil {
		t.Fatal(err)
	}
	relayHost := f.block + "41"
	good, _ := engineCA.Server("engine", relayHost)
	goodCert, _ := good.TLS()
	relay := startTLSRelay(t, relayHost, f.engineAddr(t), goodCert)
	relay2 := startTLSRelay(t, relayHost, f.engineAddr(t), goodCert)
	stranger, _ := f.ca.Server("stranger", f.block+"42")
	strangerCert, _ := stranger.TLS()
	bad := startTLSRelay(t, f.block+"42", f.engineAddr(t), strangerCert)

	var goodPort, goodID int
	args := func(port int) map[string]any {
		return map[string]any{"port": port, "security": 2, "probetype": "tcp", "mtls_backend": map[string]any{"verify_server_cert": true, "backend_ca_path": engineCAFile}}
	}
	e2e := func(endpoint string) string {
		port := testnet.Port(t, f.vip)
		f.certify(t, port, "e2e")
		id := f.rule(t, args(port), endpoint)
		if goodPort == 0 {
			goodPort, goodID = port, id
		}
		return fmt.Sprintf("https://%s:%d/v1/completions", f.vip, port)
	}
	c := f.client(nil)
	body := fmt.Sprintf(`{"model":%q,"prompt":"end to end https","max_tokens":4}`, model)
	url := e2e(relay.addr)
	conns := func(result string) float64 {
		return f.metric(t, "kvgate_backend_connections_total", map[string]string{"service": strconv.Itoa(goodID), "result": result})
	}
	post := func(i int) {
		t.Helper()
		resp, err := c.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !bytes.Contains(b, []byte(`"text_completion"`)) {
			t.Fatalf("request %d over e2ehttps: %d %s", i, resp.StatusCode, b)
		}
		// The connection goes back to the pool just after the client's
		// last byte.
		waitFor(t, "the engine connection back in the pool", 5*time.Second, func() bool { return conns("reused")+conns("dialed") == float64(i+1) })
	}
	const n = 5
	for i := 0; i < n; i++ {
		post(i)
	}
	if h, d, r := relay.handshakes.Load(), conns("dialed"), conns("reused"); h != 1 || d != 1 || r != n-1 {
		t.Errorf("%d requests: the engine saw %d TLS connections, kvgate dialed %v and reused %v; want 1, 1 and %d", n, h, d, r, n-1)
	}
	// The engine closes its idle connection: the next request opens a new
	// one (a resumed session) and succeeds.
	relay.closeAll()
	waitFor(t, "the engine's connection closed", 5*time.Second, func() bool { return relay.open.Load() == 0 })
	post(n)
	if h, r := relay.handshakes.Load(), relay.resume.Load(); h != 2 || r != 1 {
		t.Errorf("after the engine closed the pooled connection: %d handshakes, %d resumed; want 2 and 1", h, r)
	}
	// Replacing the endpoint (a re-POST of the rule) closes the idle
	// connection to the one removed; the next request opens one to the new.
	if st, b := f.post(t, args(goodPort), relay2.addr); st != 200 {
		t.Fatalf("re-posting the rule with another endpoint: %d %s", st, b)
	}
	// Within 2 s, under the pool's 4 s idle timeout: the change itself
	// closes it.
	waitFor(t, "the removed endpoint's pooled connection closed", 2*time.Second, func() bool { return relay.open.Load() == 0 })
	post(n + 1)
	if relay2.handshakes.Load() != 1 || relay.handshakes.Load() != 2 {
		t.Errorf("after the endpoint change: %d handshakes at the new engine, %d at the old; want 1 and 2", relay2.handshakes.Load(), relay.handshakes.Load())
	}
	// Setting the endpoint admin down closes its idle connection too.
	admin := func(state string) {
		t.Helper()
		h, p, _ := net.SplitHostPort(relay2.addr)
		req, _ := http.NewRequest(http.MethodPut, fmt.Sprintf("%s/netlox/v1/config/loadbalancer/externalipaddress/%s/port/%d/protocol/tcp/endpoint", f.api, f.vip, goodPort),
			strings.NewReader(fmt.Sprintf(`{"endpointIP":%q,"targetPort":%s,"admin":%q}`, h, p, state)))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("admin %s: %d %s", state, resp.StatusCode, b)
		}
	}
	admin("down")
	waitFor(t, "the admin-down endpoint's pooled connection closed", 2*time.Second, func() bool { return relay2.open.Load() == 0 })
	admin("up")
	post(n + 2)
	if relay2.handshakes.Load() != 2 {
		t.Errorf("after admin down and up: %d handshakes at the engine, want 2", relay2.handshakes.Load())
	}
	// Deleting the rule closes its idle engine connection.
	req, _ := http.NewRequest(http.MethodDelete, fmt.Sprintf("%s/netlox/v1/config/loadbalancer/externalipaddress/%s/port/%d/protocol/tcp", f.api, f.vip, goodPort), nil)
	dresp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	dresp.Body.Close()
	if dresp.StatusCode != 200 {
		t.Fatalf("deleting the e2ehttps rule: %d", dresp.StatusCode)
	}
	waitFor(t, "the pooled engine connection closed with its rule", 2*time.Second, func() bool { return relay2.open.Load() == 0 })
	resp, err := c.Post(e2e(bad.addr), "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 502 || bad.handshakes.Load() != 0 {
		t.Fatalf("an engine with a certificate from another CA: %d %s (%d handshakes completed)", resp.StatusCode, b, bad.handshakes.Load())
	}
}
