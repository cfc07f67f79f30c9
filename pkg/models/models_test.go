package models

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// vllmModels is /v1/models as vLLM answers with --served-model-name base
// alias and one adapter from --lora-modules (shape: show_available_models
// in vLLM's vllm/entrypoints/openai/serving_models.py).
const vllmModels = `{"object":"list","data":[
 {"id":"Qwen/Qwen3-0.6B","object":"model","created":1,"owned_by":"vllm","root":"/models/qwen3","parent":null,"max_model_len":4096,"permission":[]},
 {"id":"qwen3","object":"model","created":1,"owned_by":"vllm","root":"/models/qwen3","parent":null,"max_model_len":4096,"permission":[]},
 {"id":"sql-lora","object":"model","created":1,"owned_by":"vllm","root":"/loras/sql","parent":"Qwen/Qwen3-0.6B","max_model_len":null,"permission":[]}]}`

func TestParse(t *testing.T) {
	long := strings.Repeat("m", MaxNameBytes+1)
	var many strings.Builder
	many.WriteString(`{"data":[`)
	for i := range MaxModels + 1 {
		if i > 0 {
			many.WriteString(",")
		}
		many.WriteString(`{"id":"m` + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + `"}`)
	}
	many.WriteString(`]}`)
	cases := []struct {
		name      string
		body      string
		bases     []string
		adapters  map[string]string
		wantError string
	}{
		{"vLLM with an alias and an adapter", vllmModels, []string{"Qwen/Qwen3-0.6B", "qwen3"}, map[string]string{"sql-lora": "Qwen/Qwen3-0.6B"}, ""},
		{"no parent field at all (SGLang, TensorRT-LLM)", `{"data":[{"id":"m"}]}`, []string{"m"}, nil, ""},
		{"empty parent is a base", `{"data":[{"id":"m","parent":""}]}`, []string{"m"}, nil, ""},
		{"a duplicate card: the first wins", `{"data":[{"id":"m"},{"id":"m","parent":"x"}]}`, []string{"m"}, nil, ""},
		{"no base model", `{"data":[{"id":"a","parent":"m"}]}`, nil, nil, "no base model"},
		{"empty list", `{"object":"list","data":[]}`, nil, nil, "no base model"},
		{"not JSON", `<html>`, nil, nil, "invalid character"},
		{"empty id", `{"data":[{"id":""}]}`, nil, nil, "empty name"},
		{"id too long", `{"data":[{"id":"` + long + `"}]}`, nil, nil, "limit"},
		{"id with spaces", `{"data":[{"id":" m"}]}`, nil, nil, "surrounding spaces"},
		{"id with a control byte", `{"data":[{"id":"m\u0001"}]}`, nil, nil, "control"},
		{"id with a C1 control", `{"data":[{"id":"m\u009b2J"}]}`, nil, nil, "control"},
		{"bad parent", `{"data":[{"id":"m"},{"id":"a","parent":"\u0000"}]}`, nil, nil, "parent"},
		{"too many models", many.String(), nil, nil, "models listed"},
		{"too big", `{"data":[{"id":"m"}],"x":"` + strings.Repeat("x", MaxResponseBytes) + `"}`, nil, nil, "bytes, limit"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := Parse([]byte(c.body))
			if c.wantError != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantError) {
					t.Fatalf("err %v, want one containing %q", err, c.wantError)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := Served{Bases: c.bases, Adapters: c.adapters}
			if !s.Equal(want) {
				t.Fatalf("got %+v, want %+v", s, want)
			}
			for _, b := range c.bases {
				if !s.Serves(b) {
					t.Errorf("Serves(%q) false", b)
				}
			}
			for a := range c.adapters {
				if !s.Serves(a) {
					t.Errorf("Serves(%q) false", a)
				}
			}
			if s.Serves("nobody") {
				t.Error("serves an unlisted model")
			}
			if s.Base() != c.bases[0] {
				t.Errorf("Base %q, want %q", s.Base(), c.bases[0])
			}
		})
	}
}

func TestFetch(t *testing.T) {
	cases := []struct {
		name      string
		token     string
		handler   http.HandlerFunc
		wantBase  string
		wantError string
	}{
		{"vLLM", "", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(vllmModels)) }, "Qwen/Qwen3-0.6B", ""},
		{"vLLM with --api-key, token sent", "k1", keyed("k1"), "Qwen/Qwen3-0.6B", ""},
		{"vLLM with --api-key, no token", "", keyed("k1"), "", "status 401"},
		{"404", "", func(w http.ResponseWriter, _ *http.Request) { http.NotFound(w, nil) }, "", "status 404"},
		{"endless body", "", func(w http.ResponseWriter, _ *http.Request) {
			chunk := []byte(strings.Repeat(" ", 64<<10))
			for range 2 * MaxResponseBytes / len(chunk) {
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
		}, "", "limit"},
		{"hung", "", func(_ http.ResponseWriter, r *http.Request) { <-r.Context().Done() }, "", "Timeout"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := httptest.NewServer(c.handler)
			defer srv.Close()
			client := &http.Client{Timeout: 300 * time.Millisecond}
			s, err := Fetch(context.Background(), client, srv.URL, c.token)
			if c.wantError != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantError) {
					t.Fatalf("err %v, want one containing %q", err, c.wantError)
				}
				return
			}
			if err != nil || s.Base() != c.wantBase {
				t.Fatalf("Fetch: %+v, %v; want base %q", s, err, c.wantBase)
			}
		})
	}
}

// keyed answers like vLLM started with --api-key key.
func keyed(key string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+key {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error":"Unauthorized"}`))
			return
		}
		_, _ = w.Write([]byte(vllmModels))
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(vllmModels))
	f.Add([]byte(`{"data":[{"id":"m","parent":null}]}`))
	f.Add([]byte(`{"data":[{"id":"a","parent":"m"},{"id":"m"}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := Parse(b)
		if err != nil {
			return
		}
		if len(s.Bases) == 0 || len(s.Bases)+len(s.Adapters) > MaxModels {
			t.Fatalf("accepted %d bases, %d adapters", len(s.Bases), len(s.Adapters))
		}
		for _, n := range s.Bases {
			if checkName(n) != nil || !s.Serves(n) {
				t.Fatalf("accepted base %q", n)
			}
		}
		for a, p := range s.Adapters {
			if checkName(a) != nil || checkName(p) != nil {
				t.Fatalf("accepted adapter %q of %q", a, p)
			}
		}
	})
}
