package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"
)

// TestRunBounded: the shutdown grace is a hard bound. A gateway whose
// shutdown never returns (a leg that ignores its cancellation, as the
// sockmap leg once did) no longer keeps the process alive; one that stops
// in time returns its own result.
func TestRunBounded(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	stuck := make(chan struct{})
	defer close(stuck)
	cases := []struct {
		name string
		run  func(context.Context, net.Listener) error
		want error
	}{
		{"stops within the grace", func(ctx context.Context, _ net.Listener) error {
			<-ctx.Done()
			time.Sleep(50 * time.Millisecond)
			return ctx.Err()
		}, context.Canceled},
		{"never stops", func(ctx context.Context, _ net.Listener) error {
			<-ctx.Done()
			<-stuck
			return nil
		}, errShutdownBound},
		{"fails before any signal", func(context.Context, net.Listener) error {
			return io.ErrUnexpectedEOF
		}, io.ErrUnexpectedEOF},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			got := make(chan error, 1)
			go func() { got <- runBounded(ctx, tc.run, nil, 300*time.Millisecond, 200*time.Millisecond, log) }()
			time.Sleep(20 * time.Millisecond)
			cancel()
			select {
			case err := <-got:
				if !errors.Is(err, tc.want) {
					t.Fatalf("runBounded: %v, want %v", err, tc.want)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("runBounded did not return: the shutdown bound is not enforced")
			}
		})
	}
}
