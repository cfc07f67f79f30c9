// Package models reads what an OpenAI-compatible engine serves from its
// GET /v1/models: the base models and the LoRA adapters on top of them.
//
// vLLM lists every served model name as a card with no parent (aliases from
// --served-model-name, the first being the name it reports), then every
// loaded LoRA adapter with its base model as parent (OpenAIServingModels.
// show_available_models in vLLM's vllm/entrypoints/openai/serving_models.py).
// SGLang and TensorRT-LLM list their served model the same way, without
// adapters. Every size is bounded: a hostile or broken engine gets a clear
// error, never unbounded memory (docs/limits.md, "Model discovery").
package models

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"time"
	"unicode"
)

// Bounds of one /v1/models answer.
const (
	// MaxResponseBytes bounds the body read; a longer one is refused whole.
	MaxResponseBytes = 1 << 20
	// MaxModels bounds the cards kept per endpoint (base models plus adapters).
	MaxModels = 256
	// MaxNameBytes bounds a model or adapter name.
	MaxNameBytes = 256
)

// Served is what one endpoint serves.
type Served struct {
	// Bases are the base model names in listing order; Bases[0] is the name
	// the engine reports as its model (vLLM's served_model_name[0]).
	Bases []string
	// Adapters maps each LoRA adapter name to its parent base model.
	Adapters map[string]string
}

// Base is the endpoint's canonical base model: the first one it lists.
func (s Served) Base() string {
	if len(s.Bases) == 0 {
		return ""
	}
	return s.Bases[0]
}

// Serves reports whether a request naming model can run on the endpoint.
func (s Served) Serves(model string) bool {
	if _, ok := s.Adapters[model]; ok {
		return true
	}
	for _, b := range s.Bases {
		if b == model {
			return true
		}
	}
	return false
}

// Equal reports whether two listings serve the same names alike.
func (s Served) Equal(o Served) bool {
	if len(s.Bases) != len(o.Bases) || len(s.Adapters) != len(o.Adapters) {
		return false
	}
	for i := range s.Bases {
		if s.Bases[i] != o.Bases[i] {
			return false
		}
	}
	for k, v := range s.Adapters {
		if w, ok := o.Adapters[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// Adapter is one LoRA adapter and the base model it runs on.
type Adapter struct {
	Name   string `json:"name"`
	Parent string `json:"parent"`
}

// AdapterList is s's adapters sorted by name, for display.
func (s Served) AdapterList() []Adapter {
	out := make([]Adapter, 0, len(s.Adapters))
	for n, p := range s.Adapters {
		out = append(out, Adapter{Name: n, Parent: p})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// EndpointState is what discovery knows of one endpoint, as the status
// view and the preflight show it (docs/status.md): the listing routing
// uses, when it was last read, and why the last read failed.
type EndpointState struct {
	// Served is the last listing read; empty (no Bases) when none was
	// read yet: the endpoint is then a candidate for every model.
	Served Served
	// CheckedAt is when the last read ended, successful or not; zero
	// while the first read is in flight.
	CheckedAt time.Time
	// Err is the last read's error, "" when it succeeded. A failed read
	// keeps Served from the read before.
	Err string
}

type card struct {
	ID     string  `json:"id"`
	Parent *string `json:"parent"`
}

type list struct {
	Data []card `json:"data"`
}

// Parse decodes a /v1/models body. An answer that lists no base model is an
// error: an engine always serves one, so such a body is not vLLM's API. A
// card naming a parent the endpoint does not list as a base is still an
// adapter of that parent (vLLM falls back to its first base model only when
// the adapter has none).
func Parse(body []byte) (Served, error) {
	if len(body) > MaxResponseBytes {
		return Served{}, fmt.Errorf("/v1/models: %d bytes, limit %d", len(body), MaxResponseBytes)
	}
	var l list
	if err := json.Unmarshal(body, &l); err != nil {
		return Served{}, fmt.Errorf("/v1/models: %w", err)
	}
	if len(l.Data) > MaxModels {
		return Served{}, fmt.Errorf("/v1/models: %d models listed, limit %d", len(l.Data), MaxModels)
	}
	var s Served
	seen := make(map[string]bool, len(l.Data))
	for i, c := range l.Data {
		if err := checkName(c.ID); err != nil {
			return Served{}, fmt.Errorf("/v1/models: data[%d].id: %w", i, err)
		}
		if seen[c.ID] {
			continue // listed twice: the first card wins
		}
		seen[c.ID] = true
		if c.Parent == nil || *c.Parent == "" {
			s.Bases = append(s.Bases, c.ID)
			continue
		}
		if err := checkName(*c.Parent); err != nil {
			return Served{}, fmt.Errorf("/v1/models: data[%d].parent: %w", i, err)
		}
		if s.Adapters == nil {
			s.Adapters = map[string]string{}
		}
		s.Adapters[c.ID] = *c.Parent
	}
	if len(s.Bases) == 0 {
		return Served{}, errors.New("/v1/models: no base model listed")
	}
	return s, nil
}

func checkName(n string) error {
	switch {
	case n == "":
		return errors.New("empty name")
	case len(n) > MaxNameBytes:
		return fmt.Errorf("name of %d bytes, limit %d", len(n), MaxNameBytes)
	case strings.TrimSpace(n) != n:
		return fmt.Errorf("name %q has surrounding spaces", n)
	}
	for _, r := range n {
		if unicode.IsControl(r) || r == '\uFFFD' { // C0, DEL and C1: a terminal may act on them
			return fmt.Errorf("name %q has a control or invalid character", n)
		}
	}
	return nil
}

// Fetch asks one endpoint what it serves. baseURL is "http://ip:port";
// token, when set, is the rule's backendTokenFile token, sent as
// Authorization: Bearer as on kvgate's probes (vLLM's --api-key guards
// /v1/models). The client's timeout bounds the call. This is the only place
// discovery talks to an engine.
func Fetch(ctx context.Context, client *http.Client, baseURL, token string) (Served, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, baseURL+"/v1/models", nil)
	if err != nil {
		return Served{}, fmt.Errorf("GET %s/v1/models: %w", baseURL, err)
	}
	req.Header.Set("Accept", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return Served{}, fmt.Errorf("GET %s/v1/models: %w", baseURL, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxResponseBytes+1))
	if err != nil {
		return Served{}, fmt.Errorf("GET %s/v1/models: reading the body: %w", baseURL, err)
	}
	if resp.StatusCode != http.StatusOK {
		return Served{}, fmt.Errorf("GET %s/v1/models: status %d", baseURL, resp.StatusCode)
	}
	s, err := Parse(body)
	if err != nil {
		return Served{}, fmt.Errorf("GET %s: %w", baseURL, err)
	}
	return s, nil
}
