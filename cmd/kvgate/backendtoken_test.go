package main

import (
	"strings"
	"testing"
)

func TestBackendTokenDirFlag(t *testing.T) {
	tests := []struct {
		in, want, err string
	}{
		{defaultBackendTokenDir, "/etc/kvgate/backend-tokens", ""},
		{"/run/secrets/engines/", "/run/secrets/engines", ""},
		{"/", "", ""},
		{"engines", "", "want an absolute directory"},
		{"", "", "want an absolute directory"},
	}
	for _, tc := range tests {
		got, err := backendTokenDir(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "--backend-token-dir") {
				t.Errorf("%q: err %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q: got %q %v, want %q", tc.in, got, err, tc.want)
		}
	}
}
