package e2e

import (
	"encoding/json"
	"testing"

	"github.com/kvgate/kvgate/internal/enginesim"
	"github.com/kvgate/kvgate/internal/testnet"
	"github.com/kvgate/kvgate/pkg/config"
)

// The worked example's topology (docs/pd.md): EP0 and EP2 prefill, EP1 decode.
var pdRoles = []int{1, 2, 1}

func pdTopology() []engineSpec {
	return []engineSpec{{role: enginesim.RolePrefill}, {role: enginesim.RoleDecode}, {role: enginesim.RolePrefill}}
}

// pdRule creates the worked example's mode-1 rule (probes every second) and returns its
// service_id and the client URL.
func pdRule(t *testing.T, tg *testGateway, block, vipHost string, engines []*enginesim.Engine, zmq int, extra map[string]any) (int, string) {
	t.Helper()
	args := map[string]any{
		"kvExactMode": 1, "kvZmqPort": zmq, "kvHashAlgo": "sha256_cbor", "kvBlockSize": 16,
		"probetype": "http", "probereq": "/health", "probeInterval": 1, "probeTimeout": 1, "probeRetries": 2,
	}
	for k, v := range extra {
		args[k] = v
	}
	id, base := createKVRule(t, tg, block+vipHost, engines, pdRoles, args)
	return id, base + "/v1/completions"
}

// startPD starts engines of topo, a userspace gateway tuned by tune (API on
// <block>.2) and the worked example's rule on <block>.1 with extra args; it returns the
// rule's service_id and completions URL.
func startPD(t *testing.T, topo []engineSpec, tune func(*config.Settings), extra map[string]any) ([]*enginesim.Engine, *testGateway, int, string) {
	t.Helper()
	block := testnet.Block(t)
	engines, zmq := startEngines(t, block, topo)
	tg := startPDGateway(t, block, "2", tune)
	id, url := pdRule(t, tg, block, "1", engines, zmq, extra)
	return engines, tg, id, url
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
