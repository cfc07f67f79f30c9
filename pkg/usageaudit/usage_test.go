package usageaudit

import (
	"fmt"
	"strings"
	"testing"
)

func TestParseJSON(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		want Usage
		ok   bool
	}{
		{"vllm with details", `{"id":"x","usage":{"prompt_tokens":40,"total_tokens":48,"completion_tokens":8,"prompt_tokens_details":{"cached_tokens":32}}}`, Usage{40, 32, true}, true},
		{"details null (flag off)", `{"usage":{"prompt_tokens":40,"prompt_tokens_details":null}}`, Usage{PromptTokens: 40}, true},
		{"details absent (vLLM: flag off, or no hit)", `{"usage":{"prompt_tokens":7,"completion_tokens":1}}`, Usage{PromptTokens: 7}, true},
		{"details without cached_tokens", `{"usage":{"prompt_tokens":7,"prompt_tokens_details":{"audio_tokens":0}}}`, Usage{PromptTokens: 7}, true},
		{"cached zero", `{"usage":{"prompt_tokens":7,"prompt_tokens_details":{"cached_tokens":0}}}`, Usage{7, 0, true}, true},
		{"usage null", `{"choices":[],"usage":null}`, Usage{}, false},
		{"no usage", `{"choices":[{"text":"usage"}]}`, Usage{}, false},
		{"no prompt_tokens", `{"usage":{"completion_tokens":3}}`, Usage{}, false},
		{"negative prompt_tokens", `{"usage":{"prompt_tokens":-1}}`, Usage{}, false},
		{"huge prompt_tokens", `{"usage":{"prompt_tokens":99999999999999}}`, Usage{}, false},
		{"fractional", `{"usage":{"prompt_tokens":1.5}}`, Usage{}, false},
		{"string count", `{"usage":{"prompt_tokens":"7"}}`, Usage{}, false},
		{"negative cached", `{"usage":{"prompt_tokens":7,"prompt_tokens_details":{"cached_tokens":-16}}}`, Usage{}, false},
		{"array", `[{"usage":{"prompt_tokens":7}}]`, Usage{}, false},
		{"truncated", `{"usage":{"prompt_tokens":7`, Usage{}, false},
		{"empty", ``, Usage{}, false},
		{"error body", `{"error":{"message":"boom","code":500}}`, Usage{}, false},
		{"responses API", `{"id":"resp_1","object":"response","usage":{"input_tokens":40,"input_tokens_details":{"cached_tokens":32},"output_tokens":2}}`, Usage{40, 32, true}, true},
		{"responses API completed event", `{"type":"response.completed","response":{"id":"r","usage":{"input_tokens":40,"input_tokens_details":{"cached_tokens":16}}}}`, Usage{40, 16, true}, true},
		{"messages API", `{"type":"message","usage":{"input_tokens":40,"output_tokens":2}}`, Usage{PromptTokens: 40}, true},
		{"messages API message_start", `{"type":"message_start","message":{"usage":{"input_tokens":40,"output_tokens":0}}}`, Usage{PromptTokens: 40}, true},
		{"prompt_tokens wins over input_tokens", `{"usage":{"prompt_tokens":7,"input_tokens":9}}`, Usage{PromptTokens: 7}, true},
		{"negative input_tokens", `{"usage":{"input_tokens":-3}}`, Usage{}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := ParseJSON([]byte(tc.doc))
			if got != tc.want || ok != tc.ok {
				t.Errorf("ParseJSON(%s) = %+v, %v; want %+v, %v", tc.doc, got, ok, tc.want, tc.ok)
			}
		})
	}
}

const (
	usageEvent = `{"id":"c","choices":[],"usage":{"prompt_tokens":33,"completion_tokens":4,"total_tokens":37,"prompt_tokens_details":{"cached_tokens":16}}}`
	tokenEvent = `{"id":"c","choices":[{"index":0,"delta":{"content":"hi"}}]}`
)

func TestCollector(t *testing.T) {
	stream := "data: " + tokenEvent + "\n\ndata: " + tokenEvent + "\n\ndata: " + usageEvent + "\n\ndata: [DONE]\n\n"
	noUsage := "data: " + tokenEvent + "\n\ndata: [DONE]\n\n"
	long := "data: {\"x\":\"" + strings.Repeat("a", 300) + "\"}\n\n"
	tests := []struct {
		name    string
		kind    Kind
		body    string
		max     int
		want    Usage
		outcome Outcome
	}{
		{"json", KindJSON, usageEvent, 0, Usage{33, 16, true}, Found},
		{"json too large", KindJSON, usageEvent, 64, Usage{}, TooLarge},
		{"json no usage", KindJSON, `{"error":"x"}`, 0, Usage{}, NoUsage},
		{"sse last event", KindEventStream, stream, 0, Usage{33, 16, true}, Found},
		{"sse crlf lines", KindEventStream, strings.ReplaceAll(stream, "\n", "\r\n"), 0, Usage{33, 16, true}, Found},
		{"sse no space after colon", KindEventStream, "data:" + usageEvent + "\n\ndata:[DONE]\n\n", 0, Usage{33, 16, true}, Found},
		{"sse without include_usage", KindEventStream, noUsage, 0, Usage{}, NoUsage},
		{"sse cut before [DONE]", KindEventStream, "data: " + usageEvent + "\n\n", 0, Usage{33, 16, true}, Found},
		{"sse comment and event lines", KindEventStream, ": ping\nevent: x\ndata: " + usageEvent + "\n\n: ping\n\n", 0, Usage{33, 16, true}, Found},
		{"sse last line too large", KindEventStream, "data: " + usageEvent + "\n\n" + long, 200, Usage{}, TooLarge},
		{"sse earlier line too large", KindEventStream, long + "data: " + usageEvent + "\n\n", len(usageEvent) + 10, Usage{33, 16, true}, Found},
		{"empty", KindEventStream, "", 0, Usage{}, NoUsage},
		{"sse messages API", KindEventStream, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":30}}}\n\n" +
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"hi\"}}\n\n" +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"input_tokens\":33,\"output_tokens\":2}}\n\n" +
			"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", 0, Usage{PromptTokens: 33}, Found},
		{"sse responses API", KindEventStream, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}\n\n" +
			"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":33,\"input_tokens_details\":{\"cached_tokens\":16}}}}\n\n", 0, Usage{33, 16, true}, Found},
		{"sse token text is the word usage", KindEventStream, "data: {\"choices\":[{\"text\":\"usage\"}]}\n\ndata: [DONE]\n\n", 0, Usage{}, NoUsage},
	}
	for _, tc := range tests {
		for _, split := range []int{1, 3, 1 << 20} {
			t.Run(fmt.Sprintf("%s/split%d", tc.name, split), func(t *testing.T) {
				c := NewCollector(tc.kind, tc.max)
				for w := tc.body; len(w) > 0; {
					k := min(split, len(w))
					c.Write([]byte(w[:k]))
					w = w[k:]
				}
				got, outcome := c.Usage()
				if got != tc.want || outcome != tc.outcome {
					t.Errorf("got %+v %s, want %+v %s", got, outcome, tc.want, tc.outcome)
				}
			})
		}
	}
}

func TestSampler(t *testing.T) {
	for _, tc := range []struct{ n, calls, want int }{{0, 100, 0}, {1, 10, 10}, {64, 640, 10}, {3, 10, 3}, {-5, 10, 0}} {
		s := NewSampler(tc.n)
		got := 0
		for range tc.calls {
			if s.Take() {
				got++
			}
		}
		if got != tc.want {
			t.Errorf("1 in %d over %d calls: %d taken, want %d", tc.n, tc.calls, got, tc.want)
		}
	}
	var nilSampler *Sampler
	if nilSampler.Take() {
		t.Error("a nil sampler took")
	}
}
