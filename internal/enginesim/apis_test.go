package enginesim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
)

// sseEvent is one named server-sent event.
type sseEvent struct {
	name string
	data map[string]any
}

func readEvents(t *testing.T, body []byte) []sseEvent {
	t.Helper()
	var out []sseEvent
	var name string
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			var d map[string]any
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &d); err != nil {
				t.Fatalf("event %q data: %v", name, err)
			}
			if d["type"] != name {
				t.Fatalf("event %q carries type %v", name, d["type"])
			}
			out = append(out, sseEvent{name, d})
		}
	}
	return out
}

func eventNames(evs []sseEvent) []string {
	var names []string
	for _, e := range evs {
		if len(names) == 0 || names[len(names)-1] != e.name {
			names = append(names, e.name)
		}
	}
	return names
}

func num(v any) int {
	f, _ := v.(float64)
	return int(f)
}

// dig walks nested JSON objects.
func dig(v any, keys ...string) any {
	for _, k := range keys {
		m, _ := v.(map[string]any)
		v = m[k]
	}
	return v
}

// TestConversationEndpoints: /v1/responses and /v1/messages render the
// conversation vLLM converts them into, so a chat request warms the cache
// for the same conversation sent through either API (same token ids, same
// blocks); both answer in their API's shape, streamed and not.
func TestConversationEndpoints(t *testing.T) {
	tok, err := LoadTokenizer(qwen3Dir)
	if err != nil {
		t.Fatal(err)
	}
	e := startEngine(t, Config{Tokenizer: tok})
	system := strings.Repeat("You are a careful assistant that answers briefly. ", 4)
	user := strings.Repeat("Explain prefix caching in one line. ", 3)

	chat := post(t, e.URL()+"/v1/chat/completions", map[string]any{"messages": []map[string]any{{"role": "system", "content": system}, {"role": "user", "content": user}}, "max_tokens": 4})
	if chat.status != http.StatusOK {
		t.Fatalf("chat: %d %s", chat.status, chat.body)
	}
	var cr struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(chat.body, &cr); err != nil {
		t.Fatal(err)
	}
	promptTokens := cr.Usage.PromptTokens
	fullBlocks := (promptTokens - 1) / DefaultBlockSize * DefaultBlockSize // vLLM never hits the last token
	if fullBlocks < 2*DefaultBlockSize {
		t.Fatalf("prompt of %d tokens is too short for the test", promptTokens)
	}

	tests := []struct {
		name   string
		path   string
		body   map[string]any
		events []string // streamed: the event names in order
		check  func(t *testing.T, r httpResult)
	}{
		// max_output_tokens ends the answer: status incomplete.
		{name: "responses", path: "/v1/responses", body: map[string]any{"instructions": system, "input": user, "max_output_tokens": 4},
			check: func(t *testing.T, r httpResult) {
				var v map[string]any
				json.Unmarshal(r.body, &v)
				if v["object"] != "response" || v["status"] != "incomplete" || dig(v, "usage", "input_tokens") != float64(promptTokens) ||
					num(dig(v, "usage", "input_tokens_details", "cached_tokens")) != fullBlocks {
					t.Fatalf("response %s; want %d input tokens, %d cached", r.body, promptTokens, fullBlocks)
				}
				out, _ := v["output"].([]any)
				if len(out) != 1 || dig(out[0], "type") != "message" || dig(out[0], "role") != "assistant" {
					t.Fatalf("output %v", v["output"])
				}
			}},
		{name: "responses streamed", path: "/v1/responses", body: map[string]any{"instructions": system, "input": []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "input_text", "text": user}}}}, "max_output_tokens": 4, "stream": true},
			events: []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
				"response.output_text.delta", "response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"},
			check: func(t *testing.T, r httpResult) {
				evs := readEvents(t, r.body)
				var deltas string
				for i, ev := range evs {
					if num(ev.data["sequence_number"]) != i {
						t.Fatalf("event %d has sequence_number %v", i, ev.data["sequence_number"])
					}
					if ev.name == "response.output_text.delta" {
						deltas += ev.data["delta"].(string)
					}
				}
				last := evs[len(evs)-1].data
				if dig(last, "response", "usage", "input_tokens") != float64(promptTokens) || num(dig(last, "response", "usage", "input_tokens_details", "cached_tokens")) != fullBlocks {
					t.Fatalf("completed event %v", last)
				}
				if done := evs[len(evs)-4].data["text"]; done != deltas || deltas == "" {
					t.Fatalf("done text %q, deltas %q", done, deltas)
				}
			}},
		{name: "messages", path: "/v1/messages", body: map[string]any{"system": system, "messages": []any{map[string]any{"role": "user", "content": user}}, "max_tokens": 4},
			check: func(t *testing.T, r httpResult) {
				var v map[string]any
				json.Unmarshal(r.body, &v)
				if v["type"] != "message" || v["role"] != "assistant" || v["stop_reason"] != "max_tokens" || dig(v, "usage", "input_tokens") != float64(promptTokens) {
					t.Fatalf("message %s", r.body)
				}
				if _, has := v["usage"].(map[string]any)["cache_read_input_tokens"]; has {
					t.Fatal("vLLM's Anthropic usage has no cache_read_input_tokens")
				}
				if got := headerInt(t, r.header, "x-enginesim-cached-tokens"); int(got) != fullBlocks {
					t.Fatalf("cached %d, want %d", got, fullBlocks)
				}
			}},
		{name: "messages streamed", path: "/v1/messages", body: map[string]any{"system": []any{map[string]any{"type": "text", "text": system}}, "messages": []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": user}}}}, "max_tokens": 4, "stream": true},
			events: []string{"message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"},
			check: func(t *testing.T, r httpResult) {
				evs := readEvents(t, r.body)
				if dig(evs[0].data, "message", "usage", "input_tokens") != float64(promptTokens) {
					t.Fatalf("message_start %v", evs[0].data)
				}
				md := evs[len(evs)-2].data
				if dig(md, "delta", "stop_reason") != "max_tokens" || dig(md, "usage", "output_tokens") != float64(4) {
					t.Fatalf("message_delta %v", md)
				}
				if got := r.header.Get("x-enginesim-cached-tokens"); got != "" && got != "0" {
					t.Logf("trailer cached tokens %s", got)
				}
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := post(t, e.URL()+tc.path, tc.body)
			if r.status != http.StatusOK {
				t.Fatalf("%d %s", r.status, r.body)
			}
			if tc.events != nil {
				if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
					t.Fatalf("content type %q", ct)
				}
				if got := eventNames(readEvents(t, r.body)); !slices.Equal(got, tc.events) {
					t.Fatalf("events %v\nwant   %v", got, tc.events)
				}
			}
			tc.check(t, r)
		})
	}
}

func TestConversationEndpointErrors(t *testing.T) {
	e := startEngine(t, Config{})
	tests := []struct {
		name, path string
		body       map[string]any
		status     int
		anthropic  bool
	}{
		{"messages without max_tokens", "/v1/messages", map[string]any{"messages": []any{map[string]any{"role": "user", "content": "x"}}}, 400, true},
		{"messages with an image", "/v1/messages", map[string]any{"max_tokens": 1, "messages": []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "image", "source": map[string]any{"type": "url", "url": "http://127.0.0.1/x"}}}}}}, 400, true},
		{"messages for another model", "/v1/messages", map[string]any{"model": "other", "max_tokens": 1, "messages": []any{map[string]any{"role": "user", "content": "x"}}}, 404, true},
		{"responses without input", "/v1/responses", map[string]any{"model": ""}, 400, false},
		{"responses with an unknown item", "/v1/responses", map[string]any{"input": []any{map[string]any{"type": "web_search_call"}}}, 400, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := post(t, e.URL()+tc.path, tc.body)
			if r.status != tc.status {
				t.Fatalf("status %d, want %d: %s", r.status, tc.status, r.body)
			}
			var v map[string]any
			if err := json.Unmarshal(r.body, &v); err != nil {
				t.Fatal(err)
			}
			if tc.anthropic {
				if v["type"] != "error" || dig(v, "error", "message") == "" || dig(v, "error", "type") == nil {
					t.Fatalf("not Anthropic's error shape: %s", r.body)
				}
			} else if dig(v, "error", "message") == nil {
				t.Fatalf("not OpenAI's error shape: %s", r.body)
			}
		})
	}
}
