package preflight

import (
	"strings"
	"testing"
)

// TestCheckUsageDetails: the probe's repeat is a cache hit, so a missing
// prompt_tokens_details means the engine runs without
// --enable-prompt-tokens-details: a WARN naming the flag.
func TestCheckUsageDetails(t *testing.T) {
	tests := []struct {
		name   string
		body   string
		result string
		fix    string
	}{
		{"details", `{"usage":{"prompt_tokens":80,"prompt_tokens_details":{"cached_tokens":64}}}`, Pass, ""},
		{"details null", `{"usage":{"prompt_tokens":80,"prompt_tokens_details":null}}`, Warn, "--enable-prompt-tokens-details"},
		{"details absent", `{"usage":{"prompt_tokens":80}}`, Warn, "--enable-prompt-tokens-details"},
		{"no usage", `{"choices":[]}`, Warn, "usage"},
		{"not JSON", `upstream error`, Warn, "usage"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := checkUsageDetails(2, []byte(tc.body))
			if c.ID != CheckUsage || c.EPIdx != 2 || c.Result != tc.result || !strings.Contains(c.Fix, tc.fix) || c.Detail == "" {
				t.Errorf("%+v", c)
			}
		})
	}
}
