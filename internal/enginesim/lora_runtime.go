package enginesim

// Runtime LoRA loading, as vLLM serves it when started with
// VLLM_ALLOW_RUNTIME_LORA_UPDATING=True: POST /v1/load_lora_adapter and
// /v1/unload_lora_adapter (OpenAIServingModels in vLLM's
// vllm/entrypoints/openai/serving_models.py). Only the name matters here:
// an adapter's cache identity is its name (docs/enginesim.md).

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
)

// maxRuntimeLoRA bounds the adapters loaded at run time.
const maxRuntimeLoRA = 64

type runtimeLoRA struct {
	mu    sync.Mutex
	names []string
}

func (l *runtimeLoRA) has(name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Contains(l.names, name)
}

func (l *runtimeLoRA) list() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.names)
}

type loraAdapterRequest struct {
	LoRAName string `json:"lora_name"`
	LoRAPath string `json:"lora_path"`
}

func (e *Engine) handleLoadLoRA(w http.ResponseWriter, r *http.Request) {
	var req loraAdapterRequest
	if b := decodeBody(r, &req); b != nil {
		writeError(w, b)
		return
	}
	name := req.LoRAName
	switch {
	case name == "" || req.LoRAPath == "":
		writeError(w, &badRequest{status: http.StatusBadRequest, typ: "InvalidUserInput", msg: "Both 'lora_name' and 'lora_path' must be provided."})
		return
	case strings.TrimSpace(name) != name || len(name) > 256 || name == e.cfg.Model:
		writeError(w, invalid("lora_name %q is not a usable adapter name", name))
		return
	case slices.Contains(e.cfg.LoRAModules, name) || e.lora.has(name):
		writeError(w, &badRequest{status: http.StatusBadRequest, typ: "InvalidUserInput", msg: fmt.Sprintf("The lora adapter '%s' has already been loaded.", name)})
		return
	}
	e.lora.mu.Lock()
	if len(e.lora.names) >= maxRuntimeLoRA {
		e.lora.mu.Unlock()
		writeError(w, invalid("at most %d adapters can be loaded at run time", maxRuntimeLoRA))
		return
	}
	e.lora.names = append(e.lora.names, name)
	e.lora.mu.Unlock()
	w.WriteHeader(http.StatusOK)
	_, _ = fmt.Fprintf(w, "Success: LoRA adapter '%s' added successfully.", name)
}

func (e *Engine) handleUnloadLoRA(w http.ResponseWriter, r *http.Request) {
	var req loraAdapterRequest
	if b := decodeBody(r, &req); b != nil {
		writeError(w, b)
		return
	}
	e.lora.mu.Lock()
	i := slices.Index(e.lora.names, req.LoRAName)
	if i >= 0 {
		e.lora.names = slices.Delete(e.lora.names, i, i+1)
	}
	e.lora.mu.Unlock()
	if i < 0 {
		writeError(w, &badRequest{status: http.StatusNotFound, typ: "NotFoundError", msg: fmt.Sprintf("The lora adapter '%s' cannot be found.", req.LoRAName)})
		return
	}
	w.WriteHeader(http.StatusOK)
	_, _ = fmt.Fprintf(w, "Success: LoRA adapter '%s' removed successfully.", req.LoRAName)
}
