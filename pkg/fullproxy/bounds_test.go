package fullproxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testnet"
)

// TestConnectionNamingHostKeepsHost: a client's "Connection: …, Host" must
// not drop its Host header on the way to the engine (it did: the backend got
// kvgate's dial address instead). Host is never hop-by-hop; other named
// headers still go.
func TestConnectionNamingHostKeepsHost(t *testing.T) {
	hosts := make(chan string, 8)
	be := startBackend(t, "ep0", func(w http.ResponseWriter, r *http.Request) { hosts <- r.Host })
	s := startProxy(t, Config{Handler: NewForward(&staticRouter{addrs: []string{be.addr}}, nil)})
	for _, conn := range []string{"keep-alive, Host", "Host", "close, host, X-Secret"} {
		resp, body := rawExchange(t, s.Addr().String(), "GET /v1/models HTTP/1.1\r\nHost: api.example\r\nX-Secret: s\r\nConnection: "+conn+"\r\n\r\n")
		if resp.StatusCode != 200 {
			t.Fatalf("Connection %q: %d %s", conn, resp.StatusCode, body)
		}
		got := be.last(t)
		if h := got.header.Get("Host"); h != "" {
			t.Fatalf("Host arrived as a header %q", h)
		}
		if host := <-hosts; host != "api.example" {
			t.Errorf("Connection %q: backend saw Host %q, want api.example", conn, host)
		}
		if strings.Contains(conn, "X-Secret") && got.header.Get("X-Secret") != "" {
			t.Errorf("Connection %q: a named header was forwarded", conn)
		}
	}
}

// TestErrorDetailsHideBackendAddresses: kvgate's error answers name the
// endpoint by index, never its address (which stays in the logs); before,
// details carried "connect to 127.0.0.1:port failed: dial tcp …".
func TestErrorDetailsHideBackendAddresses(t *testing.T) {
	deadPort := strconv.Itoa(testnet.Port(t, "127.0.0.1"))
	dead := net.JoinHostPort("127.0.0.1", deadPort)
	silent, err := net.Listen("tcp", "127.0.0.1:0") // accepts, then closes without answering
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = bufio.NewReader(c).ReadString('\n'); c.Close() }()
		}
	}()
	for _, c := range []struct {
		name  string
		addrs []string
	}{
		{"unreachable", []string{dead}},
		{"closed without a response", []string{silent.Addr().String()}},
	} {
		s := startProxy(t, Config{Handler: NewForward(&staticRouter{addrs: c.addrs}, nil), Limits: Limits{MaxAttempts: 1}})
		resp, body := rawExchange(t, s.Addr().String(), "GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
		var eb ErrorBody
		if resp.StatusCode != 502 || json.Unmarshal([]byte(body), &eb) != nil || eb.Detail == "" {
			t.Fatalf("%s: %d %s", c.name, resp.StatusCode, body)
		}
		if strings.Contains(body, "127.0.0.1") || strings.Contains(body, deadPort) || strings.Contains(body, "tcp") {
			t.Errorf("%s: the client sees a backend address: %s", c.name, body)
		}
	}
	for _, c := range []struct{ in, want string }{
		{"connect to 10.1.2.3:8000 failed: dial tcp 10.1.2.3:8000: connect: connection refused", "connect to <endpoint> failed: dial tcp <endpoint>: connect: connection refused"},
		{"read tcp [fe80::1%eth0]:5000->[2001:db8::7]:8000: reset", "read tcp <endpoint>-><endpoint>: reset"},
		{"closed: 2001:db8::7 gone; 1.5 s", "closed: <endpoint> gone; 1.5 s"},
		{"prefill did not complete within 30s", "prefill did not complete within 30s"},
	} {
		if got := redactAddrs(c.in); got != c.want {
			t.Errorf("redactAddrs(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// TestEngineRefusalOfALargeBodyIsRelayed: a body over the inspection limit
// streams to the engine; when the engine answers 413 and closes before
// reading it all, the client gets the engine's 413, not a 502 "broken pipe".
func TestEngineRefusalOfALargeBodyIsRelayed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	const refusal = `{"error":"payload too large"}`
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for { // the head only; the body is never read
					l, err := br.ReadString('\n')
					if err != nil || l == "\r\n" {
						break
					}
				}
				fmt.Fprintf(c, "HTTP/1.1 413 Payload Too Large\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(refusal), refusal)
			}()
		}
	}()
	s := startProxy(t, Config{Handler: NewForward(&staticRouter{addrs: []string{ln.Addr().String()}}, nil),
		Limits: Limits{MaxBodyBytes: 256 << 20, InspectBytes: 1024}})
	const size = 64 << 20 // larger than the loopback socket buffers, so kvgate's send fails
	c := dialProxy(t, s)
	c.SetDeadline(time.Now().Add(30 * time.Second))
	go func() {
		_, _ = fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", size)
		chunk := make([]byte, 1<<20)
		for i := 0; i < size/len(chunk); i++ {
			if _, err := c.Write(chunk); err != nil {
				return // kvgate stopped reading after the engine's answer
			}
		}
	}()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no response: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 413 || string(body) != refusal {
		t.Fatalf("got %d %s, want the engine's 413 %s", resp.StatusCode, body, refusal)
	}
}
