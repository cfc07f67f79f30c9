package datapath

import (
	"errors"
	"io"
	"log/slog"
	"testing"
)

func TestParseMode(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Mode
		err  bool
	}{
		{"auto", ModeAuto, false},
		{"", ModeAuto, false},
		{"sockmap", ModeSockmap, false},
		{"userspace", ModeUserspace, false},
		{"kernel", "", true},
		{"Sockmap", "", true},
	} {
		got, err := ParseMode(tc.in)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("ParseMode(%q) = %q, %v; want %q, error %v", tc.in, got, err, tc.want, tc.err)
		}
	}
}

func TestNewFallback(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	unavailable := func() (KernelLeg, error) { return nil, ErrKernelUnavailable }
	for _, tc := range []struct {
		name     string
		mode     Mode
		open     KernelOpener
		wantPath string
		wantErr  bool
	}{
		{"userspace", ModeUserspace, unavailable, "userspace", false},
		{"auto without kernel", ModeAuto, unavailable, "userspace", false},
		{"auto not built in", ModeAuto, nil, "userspace", false},
		{"sockmap not built in", ModeSockmap, nil, "", true},
		{"sockmap unavailable", ModeSockmap, unavailable, "", true},
		{"bad mode", Mode("fast"), nil, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := New(Config{Mode: tc.mode, OpenKernel: tc.open, Logger: quiet})
			if (err != nil) != tc.wantErr {
				t.Fatalf("err %v, want error %v", err, tc.wantErr)
			}
			if err != nil {
				if tc.open != nil && !errors.Is(err, ErrKernelUnavailable) {
					t.Fatalf("error %v does not wrap ErrKernelUnavailable", err)
				}
				return
			}
			if s.Path() != tc.wantPath || s.Stats().Path != tc.wantPath || s.Reason == "" {
				t.Fatalf("path %s (stats %s), reason %q", s.Path(), s.Stats().Path, s.Reason)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}
