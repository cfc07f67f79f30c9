package enginesim

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestAPIKey mirrors vLLM's AuthenticationMiddleware: the guarded prefixes
// need one of the keys, every other path and OPTIONS stay open, and a
// refusal is 401 {"error":"Unauthorized"}.
func TestAPIKey(t *testing.T) {
	e := startEngine(t, Config{APIKeys: []string{"sk-one", "", "sk-two"}, KVEventsEndpoint: "none", ReplayEndpoint: "none"})
	completion := `{"model":"` + e.cfg.Model + `","prompt":[1,2,3],"max_tokens":1}`
	tests := []struct {
		name, method, path, auth, body string
		want                           int
	}{
		{"models without a key", "GET", "/v1/models", "", "", 401},
		{"models with the first key", "GET", "/v1/models", "Bearer sk-one", "", 200},
		{"models with the second key", "GET", "/v1/models", "Bearer sk-two", "", 200},
		{"scheme in any case", "GET", "/v1/models", "bEaReR sk-one", "", 200},
		{"a wrong key", "GET", "/v1/models", "Bearer sk-three", "", 401},
		{"the empty key is not a key", "GET", "/v1/models", "Bearer ", "", 401},
		{"another scheme", "GET", "/v1/models", "Basic sk-one", "", 401},
		{"no space", "GET", "/v1/models", "Bearersk-one", "", 401},
		{"two spaces (the key is the rest)", "GET", "/v1/models", "Bearer  sk-one", "", 401},
		{"completions without a key", "POST", "/v1/completions", "", completion, 401},
		{"completions with a key", "POST", "/v1/completions", "Bearer sk-two", completion, 200},
		{"responses without a key", "POST", "/v1/responses", "", `{"model":"m","input":"hi"}`, 401},
		{"messages without a key", "POST", "/v1/messages", "", `{"model":"m","max_tokens":1,"messages":[]}`, 401},
		{"unknown /v1 path still guarded", "GET", "/v1/nothing", "", "", 401},
		{"prefix match as vLLM's startswith", "GET", "/v1nothing", "", "", 401},
		{"/v2 guarded", "GET", "/v2/x", "", "", 401},
		{"/inference guarded", "GET", "/inference/x", "", "", 401},
		{"/cohere guarded", "GET", "/cohere/x", "", "", 401},
		{"OPTIONS is never checked", "OPTIONS", "/v1/models", "", "", 405},
		{"health is open", "GET", "/health", "", "", 200},
		{"metrics are open", "GET", "/metrics", "", "", 200},
		{"version is open", "GET", "/version", "", "", 200},
		{"tokenize is open", "POST", "/tokenize", "", `{"model":"` + e.cfg.Model + `","prompt":"hi"}`, 200},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, e.URL()+tc.path, strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Fatalf("%s %s: %d %s, want %d", tc.method, tc.path, resp.StatusCode, body, tc.want)
			}
			if tc.want == 401 && string(body) != `{"error":"Unauthorized"}` {
				t.Fatalf("401 body %s", body)
			}
		})
	}
}

// TestNoAPIKeyOpen: without keys nothing is guarded, as vLLM without
// --api-key.
func TestNoAPIKeyOpen(t *testing.T) {
	e := startEngine(t, Config{KVEventsEndpoint: "none", ReplayEndpoint: "none"})
	resp, err := http.Get(e.URL() + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
}
