package pd

import (
	"bytes"
	"encoding/json"
	"testing"
)

func TestParseBody(t *testing.T) {
	for _, tc := range []struct {
		body string
		ok   bool
	}{
		{`{"model":"m","prompt":"x"}`, true},
		{` {"model":"m","messages":[{"role":"user","content":"x"}]}`, true},
		{`{"prompt":["only one"]}`, true},
		{`{"prompt":[1,2,3]}`, true},
		{`{"prompt":[[1,2],[3]]}`, false},
		{`{"prompt":["a","b"]}`, false},
		{`{"prompt":"x","n":2}`, false},
		{`{"prompt":"x","n":1}`, true},
		{`{"prompt":"x","n":null}`, true},
		{`[1,2]`, false},
		{`not json`, false},
		{``, false},
		{`{"prompt":"x"`, false},
	} {
		_, err := parseBody([]byte(tc.body))
		if (err == nil) != tc.ok {
			t.Errorf("parseBody(%s): err %v, want ok=%v", tc.body, err, tc.ok)
		}
	}
}

func TestPrefillBodyWithoutLimits(t *testing.T) {
	m, _ := parseBody([]byte(`{"model":"m","prompt":"x"}`))
	b, err := m.prefillBody()
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	_ = json.Unmarshal(b, &got)
	if got["max_tokens"] != 1.0 {
		t.Fatalf("max_tokens not set: %s", b)
	}
	if _, ok := got["max_completion_tokens"]; ok {
		t.Fatalf("max_completion_tokens added though the client did not use it: %s", b)
	}
}

func TestParsePrefillAndUsage(t *testing.T) {
	for _, tc := range []struct {
		resp   string
		params bool
		cached int
	}{
		{`{"kv_transfer_params":{"a":1},"usage":{"prompt_tokens_details":{"cached_tokens":16}}}`, true, 16},
		{`{"kv_transfer_params":null,"usage":{"prompt_tokens_details":null}}`, false, -1},
		{`{"kv_transfer_params":"x"}`, false, -1},
		{`garbage`, false, -1},
	} {
		r := parsePrefill([]byte(tc.resp))
		if (r.params != nil) != tc.params || r.cached != tc.cached {
			t.Errorf("parsePrefill(%s) = %s, %d", tc.resp, r.params, r.cached)
		}
	}
	out, ok := withCachedTokens([]byte(`{"id":"x","usage":{"prompt_tokens":40,"prompt_tokens_details":null}}`), 32)
	if !ok || !bytes.Contains(out, []byte(`"prompt_tokens_details":{"cached_tokens":32}`)) {
		t.Fatalf("withCachedTokens: %s %v", out, ok)
	}
	if _, ok := withCachedTokens([]byte(`{"id":"x"}`), 3); ok {
		t.Fatal("a body without usage was rewritten")
	}
}

// FuzzRewrite: whatever the client body, the legs' bodies are valid JSON
// with the rewrite's invariants, and response parsing never panics.
func FuzzRewrite(f *testing.F) {
	for _, s := range []string{
		clientBody,
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":9,"stream":false}`,
		`{"prompt":[[1,2]],"kv_transfer_params":{"x":1}}`,
		`{"prompt":"x","n":1,"min_tokens":5}`,
		`{"usage":{"prompt_tokens_details":{"cached_tokens":3}},"kv_transfer_params":{"remote_block_ids":[1]}}`,
		`{}`, `[]`, `{"a":`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		parsePrefill(b)
		if out, ok := withCachedTokens(b, 7); ok && !json.Valid(out) {
			t.Fatalf("withCachedTokens produced invalid JSON from %q", b)
		}
		m, err := parseBody(b)
		if err != nil {
			return
		}
		pb, err := m.prefillBody()
		if err != nil {
			t.Fatalf("prefillBody: %v", err)
		}
		var p map[string]json.RawMessage
		if err := json.Unmarshal(pb, &p); err != nil {
			t.Fatalf("prefill body invalid: %v", err)
		}
		if string(p["stream"]) != "false" || string(p["max_tokens"]) != "1" || !bytes.Equal(p["kv_transfer_params"], prefillStub) {
			t.Fatalf("prefill invariants broken: %s", pb)
		}
		for _, k := range []string{"stream_options", "min_tokens", "min_completion_tokens"} {
			if _, ok := p[k]; ok {
				t.Fatalf("prefill keeps %s", k)
			}
		}
		params := json.RawMessage(`{"remote_engine_id":"e"}`)
		db, err := decodeBody(b, m, params)
		if err != nil {
			t.Fatalf("decodeBody: %v", err)
		}
		var d map[string]json.RawMessage
		if err := json.Unmarshal(db, &d); err != nil || !bytes.Equal(d["kv_transfer_params"], params) {
			t.Fatalf("decode body %s: %v", db, err)
		}
		if plain, _ := decodeBody(b, m, nil); !bytes.Equal(plain, b) {
			t.Fatal("decode body without params is not the original")
		}
	})
}

// BenchmarkRewrite: the per-request JSON work of the P/D flow on a 4 KiB
// chat body: parse, prefill body, decode body with params, usage copy.
func BenchmarkRewrite(b *testing.B) {
	msg := bytes.Repeat([]byte("lorem ipsum "), 340)
	body := []byte(`{"model":"m","messages":[{"role":"system","content":"` + string(msg) + `"},{"role":"user","content":"hi"}],"max_tokens":64,"stream":true,"stream_options":{"include_usage":true}}`)
	params := json.RawMessage(`{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[1,2,3,4,5,6,7,8],"remote_engine_id":"e","remote_request_id":"r","remote_host":"10.0.0.1","remote_port":5600,"tp_size":1}`)
	resp := []byte(`{"id":"x","choices":[{"text":"hello"}],"usage":{"prompt_tokens":1000,"completion_tokens":64,"prompt_tokens_details":{"cached_tokens":0}}}`)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		m, err := parseBody(body)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := m.prefillBody(); err != nil {
			b.Fatal(err)
		}
		if _, err := decodeBody(body, m, params); err != nil {
			b.Fatal(err)
		}
		withCachedTokens(resp, 512)
	}
}

func TestDecodeBodySplice(t *testing.T) {
	params := json.RawMessage(`{"remote_engine_id":"e"}`)
	for _, tc := range []struct{ in, want string }{
		{`{"prompt":"x", "stream":true}`, `{"prompt":"x", "stream":true,"kv_transfer_params":{"remote_engine_id":"e"}}`},
		{" {}\n", ` {"kv_transfer_params":{"remote_engine_id":"e"}}` + "\n"},
		{`{"prompt":"}","kv_transfer_params":null}`, `{"kv_transfer_params":{"remote_engine_id":"e"},"prompt":"}"}`},
	} {
		m, err := parseBody([]byte(tc.in))
		if err != nil {
			t.Fatal(err)
		}
		got, err := decodeBody([]byte(tc.in), m, params)
		if err != nil || string(got) != tc.want {
			t.Errorf("decodeBody(%s) = %s, %v; want %s", tc.in, got, err, tc.want)
		}
	}
}
