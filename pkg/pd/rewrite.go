package pd

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// prefillStub is the kv_transfer_params the prefill leg carries, as vLLM's
// own proxy (toy_proxy_server.py) and llm-d's nixlv2 connector send it.
var prefillStub = json.RawMessage(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)

var (
	rawFalse = json.RawMessage(`false`)
	rawOne   = json.RawMessage(`1`)
)

// errNotOrchestrated: the request is not a single-prompt JSON object; it
// takes the plain path.
var errNotOrchestrated = errors.New("not a single-prompt JSON request")

// body is a client request body as a JSON object whose values are kept
// verbatim.
type body map[string]json.RawMessage

// parseBody accepts a JSON object that is a single generation: n absent or
// 1, and a prompt that is not a list of several prompts (vLLM returns only
// the first prompt's kv_transfer_params).
func parseBody(b []byte) (body, error) {
	t := bytes.TrimLeft(b, " \t\r\n")
	if len(t) == 0 || t[0] != '{' {
		return nil, errNotOrchestrated
	}
	var m body
	if err := json.Unmarshal(t, &m); err != nil {
		return nil, errNotOrchestrated
	}
	if n, ok := m["n"]; ok && !isNullOr(n, "1") {
		return nil, errNotOrchestrated
	}
	if p, ok := m["prompt"]; ok && severalPrompts(p) {
		return nil, errNotOrchestrated
	}
	return m, nil
}

func isNullOr(v json.RawMessage, want string) bool {
	s := string(bytes.TrimSpace(v))
	return s == "null" || s == want
}

// severalPrompts reports a prompt that is a list of strings or of token
// lists with more than one element.
func severalPrompts(p json.RawMessage) bool {
	var list []json.RawMessage
	if json.Unmarshal(p, &list) != nil || len(list) <= 1 {
		return false
	}
	first := bytes.TrimSpace(list[0])
	return len(first) > 0 && (first[0] == '"' || first[0] == '[')
}

// prefillBody is the prefill leg's body (docs/pd.md, prefill leg): the stub
// kv_transfer_params, stream false, stream_options removed, max_tokens 1,
// max_completion_tokens 1 when present, min_tokens and min_completion_tokens
// removed (restored for decode, which gets the original body).
func (m body) prefillBody() ([]byte, error) {
	p := make(body, len(m)+3)
	for k, v := range m {
		p[k] = v
	}
	p["kv_transfer_params"] = prefillStub
	p["stream"] = rawFalse
	delete(p, "stream_options")
	p["max_tokens"] = rawOne
	if _, ok := m["max_completion_tokens"]; ok {
		p["max_completion_tokens"] = rawOne
	}
	delete(p, "min_tokens")
	delete(p, "min_completion_tokens")
	return json.Marshal(p)
}

// decodeBody is the decode leg's body (docs/pd.md): the original body plus the
// prefill's kv_transfer_params verbatim. Without params it is the original
// body byte for byte; otherwise the params are spliced in before the closing
// brace, so every other byte (the prompt above all: the decode engine
// re-tokenizes it) stays the client's. A client body that already carries
// kv_transfer_params is re-encoded with the prefill's in its place.
func decodeBody(original []byte, m body, params json.RawMessage) ([]byte, error) {
	if params == nil {
		return original, nil
	}
	if _, has := m["kv_transfer_params"]; !has {
		end := bytes.LastIndexByte(original, '}')
		if end < 0 {
			return nil, errNotOrchestrated
		}
		out := make([]byte, 0, len(original)+len(params)+24)
		out = append(out, original[:end]...)
		if len(m) > 0 {
			out = append(out, ',')
		}
		out = append(out, `"kv_transfer_params":`...)
		out = append(out, params...)
		return append(out, original[end:]...), nil
	}
	d := make(body, len(m)+1)
	for k, v := range m {
		d[k] = v
	}
	d["kv_transfer_params"] = params
	return json.Marshal(d)
}

// prefillResult is what the flow reads from a prefill response.
type prefillResult struct {
	// params is the kv_transfer_params object verbatim; nil when absent,
	// null or not an object.
	params json.RawMessage
	// cached is usage.prompt_tokens_details.cached_tokens, -1 when absent.
	cached int
}

func parsePrefill(b []byte) prefillResult {
	r := prefillResult{cached: -1}
	var resp struct {
		KV    json.RawMessage `json:"kv_transfer_params"`
		Usage *struct {
			Details *struct {
				Cached *int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if json.Unmarshal(b, &resp) != nil {
		return r
	}
	if kv := bytes.TrimSpace(resp.KV); len(kv) > 0 && kv[0] == '{' {
		r.params = kv
	}
	if resp.Usage != nil && resp.Usage.Details != nil && resp.Usage.Details.Cached != nil {
		r.cached = *resp.Usage.Details.Cached
	}
	return r
}

// withCachedTokens sets usage.prompt_tokens_details.cached_tokens in a
// buffered decode response to the prefill's figure (the client sees where
// its prompt actually hit, as llm-d's cached-tokens rewriter does). It
// returns the body unchanged when it has no usage object.
func withCachedTokens(b []byte, cached int) ([]byte, bool) {
	var resp body
	if json.Unmarshal(b, &resp) != nil {
		return b, false
	}
	var usage body
	if u, ok := resp["usage"]; !ok || json.Unmarshal(u, &usage) != nil || usage == nil {
		return b, false
	}
	var details body
	if d, ok := usage["prompt_tokens_details"]; ok {
		_ = json.Unmarshal(d, &details)
	}
	if details == nil {
		details = body{}
	}
	details["cached_tokens"] = json.RawMessage(strconv.Itoa(cached))
	var err error
	if usage["prompt_tokens_details"], err = json.Marshal(details); err != nil {
		return b, false
	}
	if resp["usage"], err = json.Marshal(usage); err != nil {
		return b, false
	}
	out, err := json.Marshal(resp)
	if err != nil {
		return b, false
	}
	return out, true
}

// newUUID is a random UUID v4 (RFC 9562).
func newUUID() [16]byte {
	var u [16]byte
	_, _ = rand.Read(u[:])
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	return u
}

func uuidString(u [16]byte) string {
	h := hex.EncodeToString(u[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// receiptID is the request id P2P-NCCL-style connectors parse:
// ___prefill_addr_<ip>:<port>___decode_addr_<ip>:<port>_<32 hex>.
func receiptID(prefill, decode Endpoint, u [16]byte) string {
	return fmt.Sprintf("___prefill_addr_%s___decode_addr_%s_%s", hostPort(prefill.IP, prefill.receiptPort()),
		hostPort(decode.IP, decode.receiptPort()), hex.EncodeToString(u[:]))
}

func hostPort(ip string, port int) string {
	if bytes.IndexByte([]byte(ip), ':') >= 0 {
		return "[" + ip + "]:" + strconv.Itoa(port)
	}
	return ip + ":" + strconv.Itoa(port)
}
