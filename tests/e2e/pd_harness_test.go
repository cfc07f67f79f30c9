package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/enginesim"
	"github.com/kvgate/kvgate/pkg/gateway"
)

// pdEngine describes one engine of a P/D test.
type pdEngine struct {
	role              enginesim.Role
	prefillUsPerToken float64 // 0: 20 µs
	decodeTS          float64 // decode tokens/s; 0: fast
}

// spec §4 topology: EP0 and EP2 prefill, EP1 decode.
var pdRoles = []int{1, 2, 1}

func pdTopology() []pdEngine {
	return []pdEngine{{role: enginesim.RolePrefill}, {role: enginesim.RoleDecode}, {role: enginesim.RolePrefill}}
}

// startPDEngines starts one enginesim per spec on <block>.11, .12, …, all
// publishing KV events on the same port.
func startPDEngines(t *testing.T, block string, specs []pdEngine) ([]*enginesim.Engine, int) {
	t.Helper()
	tk := engineTokenizer(t)
	var lastErr error
	for try := 0; try < 10; try++ {
		port := freePort(t, block+"11")
		var engines []*enginesim.Engine
		for i, s := range specs {
			host := fmt.Sprintf("%s%d", block, 11+i)
			dts, us := s.decodeTS, s.prefillUsPerToken
			if dts == 0 {
				dts = 2000
			}
			if us == 0 {
				us = 20
			}
			e, err := enginesim.New(enginesim.Config{
				Host: host, ID: fmt.Sprintf("engine-%d", i), Model: model, Tokenizer: tk,
				PythonHashSeed: "0", HashSeedSet: true, Role: s.role,
				KVEventsEndpoint:  fmt.Sprintf("tcp://%s:%d", host, port),
				ReplayEndpoint:    fmt.Sprintf("tcp://%s:%d", host, port+1000),
				PrefillUsPerToken: us, TTFTFloor: time.Millisecond, DecodeTokensPerS: dts,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			})
			if err != nil {
				lastErr = err
				break
			}
			engines = append(engines, e)
		}
		if len(engines) == len(specs) {
			t.Cleanup(func() {
				for _, e := range engines {
					e.Close()
				}
			})
			return engines, port
		}
		for _, e := range engines {
			e.Close()
		}
	}
	t.Fatalf("start engines: %v", lastErr)
	return nil, 0
}

// startPDGateway is startGateway with settings adjusted by tune (short
// P/D timeouts, fallback, admission caps).
func startPDGateway(t *testing.T, block, apiHost string, tune func(*config.Settings)) *testGateway {
	t.Helper()
	settings := config.DefaultSettings()
	settings.NoneHashSeed, settings.NoneHashSeedSet = "0", true
	if tune != nil {
		tune(&settings)
	}
	access := &syncBuffer{}
	g, err := gateway.New(gateway.Options{Settings: settings, TokenizerDir: stagingDir(t), DecisionHeader: true,
		AccessLog: access, ShutdownGrace: 5 * time.Second, Datapath: "userspace",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", block+apiHost+":0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tg := &testGateway{g: g, api: "http://" + ln.Addr().String(), access: access, cancel: cancel, done: make(chan error, 1)}
	go func() { tg.done <- g.Run(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		<-tg.done
	})
	return tg
}

// pdRule creates the §4 mode-1 rule (probes every second) and returns its
// service_id and the client URL.
func pdRule(t *testing.T, tg *testGateway, block, vipHost string, engines []*enginesim.Engine, zmq int, extra map[string]any) (int, string) {
	t.Helper()
	vip := block + vipHost
	port := freePort(t, vip)
	args := map[string]any{
		"kvExactMode": 1, "kvZmqPort": zmq, "kvHashAlgo": "sha256_cbor", "kvBlockSize": 16,
		"probetype": "http", "probereq": "/health", "probeInterval": 1, "probeTimeout": 1, "probeRetries": 2,
	}
	for k, v := range extra {
		args[k] = v
	}
	id := tg.createRule(t, ruleJSON(t, vip, port, args, engines, pdRoles))
	return id, fmt.Sprintf("http://%s:%d/v1/completions", vip, port)
}

// engineMetric reads one counter from an engine's /metrics (summed over
// its series).
func engineMetric(t *testing.T, e *enginesim.Engine, name string) float64 {
	t.Helper()
	resp, err := http.Get(e.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	total := 0.0
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		if strings.HasPrefix(rest, "{") {
			rest = rest[strings.Index(rest, "}")+1:]
		} else if !strings.HasPrefix(rest, " ") {
			continue
		}
		if v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64); err == nil {
			total += v
		}
	}
	return total
}

// errorCode reads kvgate's {"error":…} body.
func errorCode(b []byte) string {
	var eb struct {
		Error string `json:"error"`
	}
	_ = json.Unmarshal(b, &eb)
	return eb.Error
}

// tokenIDs is n consecutive token ids from base.
func tokenIDs(base, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = base + i
	}
	return out
}
