package enginesim

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"
)

func FuzzParsePrompt(f *testing.F) {
	for _, s := range []string{`"hi"`, `[1,2,3]`, `[[1,2]]`, `["a"]`, `["a","b"]`, `[]`, `null`, `[-1]`, `[1.5]`, `[4294967296]`, `{"x":1}`, `[[[]]]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		text, ids, isText, bad := parsePrompt(raw)
		if bad != nil {
			if bad.status != 400 || bad.msg == "" {
				t.Fatalf("bad error %+v", bad)
			}
			return
		}
		if isText && text == "" || !isText && len(ids) == 0 {
			t.Fatalf("accepted an empty prompt: %q", raw)
		}
	})
}

func FuzzParseMessages(f *testing.F) {
	for _, s := range []string{`[{"role":"user","content":"hi"}]`, `[{"role":"user","content":[{"type":"text","text":"a"}]}]`, `[]`, `[{"content":"x"}]`, `[{"role":"u","content":5}]`, `{}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		msgs, bad := parseMessages(raw)
		if bad == nil && len(msgs) == 0 {
			t.Fatalf("accepted no messages: %q", raw)
		}
	})
}

// FuzzRequestBodies throws arbitrary bodies at the generation endpoints: every
// answer must be a well-formed response with x-engine-id, never a panic or
// a hang.
func FuzzRequestBodies(f *testing.F) {
	e, err := New(Config{Host: "127.0.0.1", Port: 0, KVEventsEndpoint: "none", Logger: quietLogger(), MaxModelLen: 256, HashSeedSet: true})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { e.Close() })
	h := e.routes()
	for _, s := range []string{
		`{"prompt":"hello","max_tokens":3}`, `{"prompt":[1,2,3],"stream":true}`, `{"messages":[{"role":"user","content":"x"}],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"prompt":"x","kv_transfer_params":{"do_remote_decode":true}}`, `{"prompt":"x","kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[1],"remote_engine_id":"e","remote_request_id":"r","remote_host":"h","remote_port":1}}`,
		`{"prompt":"x","max_tokens":-1}`, `{"prompt":"x","n":3}`, `nonsense`,
	} {
		f.Add(uint8(0), []byte(s))
		f.Add(uint8(1), []byte(s))
	}
	for _, s := range []string{
		`{"input":"hello","instructions":"be brief","max_output_tokens":3,"stream":true}`,
		`{"input":[{"role":"user","content":[{"type":"input_text","text":"x"}]},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"}]}`,
	} {
		f.Add(uint8(3), []byte(s))
	}
	for _, s := range []string{
		`{"max_tokens":3,"system":"s","messages":[{"role":"user","content":"hi"}],"stream":true}`,
		`{"max_tokens":3,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"r"}]}]}`,
	} {
		f.Add(uint8(4), []byte(s))
	}
	paths := []string{"/v1/completions", "/v1/chat/completions", "/tokenize", "/v1/responses", "/v1/messages"}
	f.Fuzz(func(t *testing.T, which uint8, body []byte) {
		req := httptest.NewRequest(http.MethodPost, paths[int(which)%len(paths)], bytes.NewReader(body))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Header().Get("x-engine-id") == "" {
			t.Fatal("no x-engine-id")
		}
		if rec.Code != 200 && rec.Code != 400 && rec.Code != 404 && rec.Code != 413 {
			t.Fatalf("status %d: %s", rec.Code, rec.Body.String())
		}
	})
}
