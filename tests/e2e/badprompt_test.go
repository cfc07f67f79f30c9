package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"testing"
)

// TestRejectedPromptsKeepServing sends, through the real proxy to enginesim,
// bodies whose prompt reqfacts rejects. Each once killed the daemon with an
// index out of range in the gateway's trie key (the kind stayed "completion"
// with no prompt). Each must now be forwarded unchanged under text_empty,
// get the engine's own clean answer, and leave the proxy serving.
func TestRejectedPromptsKeepServing(t *testing.T) {
	_, _, _, base := startMode3(t, []engineSpec{{}, {}}, nil)
	for _, prompt := range []string{`[]`, `""`, `5`, `true`, `{}`, `[-1]`, `[1.5]`, `[4294967296]`, `[[]]`, `["a",5]`} {
		for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
			field := "prompt"
			if path == "/v1/chat/completions" {
				field = "messages"
			}
			// A model the engines serve: kvgate answers an unserved one
			// itself (404 model_not_found) before reading the prompt.
			body := `{"model":"` + model + `","` + field + `":` + prompt + `}`
			t.Run(path+" "+body, func(t *testing.T) {
				resp, err := http.Post(base+path, "application/json", bytes.NewReader([]byte(body)))
				if err != nil {
					t.Fatalf("proxy dropped the request: %v", err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode < 200 || resp.StatusCode >= 500 || !json.Valid(b) {
					t.Fatalf("status %d body %q: want the engine's clean answer", resp.StatusCode, b)
				}
				if r := decisionField(resp.Header.Get("x-kvgate-decision"), "reason"); r != "text_empty" {
					t.Fatalf("decision %q: want reason text_empty", resp.Header.Get("x-kvgate-decision"))
				}
			})
		}
	}
	if r := post(t, base+"/v1/completions", map[string]any{"model": model, "prompt": "still serving", "max_tokens": 1}); r.status != 200 {
		t.Fatalf("after the bad bodies: %d %s", r.status, r.body)
	}
}
