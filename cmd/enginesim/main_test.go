package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"
)

// TestFlagErrors: bad timing flags stop start-up with a message naming the
// flag, before anything listens.
func TestFlagErrors(t *testing.T) {
	tests := []struct {
		args    []string
		wantErr string
	}{
		{[]string{"--perf-model", "gpt-9"}, `perf-model "gpt-9": want one of simple, llama3-8b-h100, codellama-34b-h100-tp2`},
		{[]string{"--perf-model", "simple", "--step-floor", "5ms"}, `--step-floor needs a --perf-model profile, not "simple"`},
		{[]string{"--step-prefill-us-per-token", "-3"}, "step costs must be finite, non-negative"},
		{[]string{"--max-num-batched-tokens", "0"}, "--max-num-batched-tokens 0: must be positive"},
		{[]string{"--num-gpu-blocks", "0"}, "--num-gpu-blocks 0: must be positive"},
		{[]string{"--max-num-seqs", "-1"}, "--max-num-seqs -1: must be positive"},
		{[]string{"--enable-chunked-prefill=false"}, "smaller than max-model-len 32768 with chunked prefill disabled"},
		{[]string{"--time-scale", "0"}, "--time-scale 0: must be positive"},
		{[]string{"--replicas", "2", "--host", "127.0.0.1", "--replica-num-gpu-blocks", "100"}, "--replica-num-gpu-blocks has 1 values for 2 replicas"},
		{[]string{"--replicas", "2", "--host", "127.0.0.1", "--replica-gpu-speed", "1,2,3"}, "--replica-gpu-speed has 3 values for 2 replicas"},
		{[]string{"--replica-gpu-speed", "0"}, "step costs must be finite"},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			cmd := newCommand()
			cmd.SetArgs(append([]string{"--log-level", "error", "--kv-events-endpoint", "none", "--port", "0"}, tc.args...))
			cmd.SetOut(io.Discard)
			cmd.SetErr(io.Discard)
			// A case that wrongly starts engines returns nil when the
			// context ends instead of waiting for a signal.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := cmd.ExecuteContext(ctx)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err %v, want %q", err, tc.wantErr)
			}
		})
	}
}
