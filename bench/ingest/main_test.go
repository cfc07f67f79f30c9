package main

import (
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testpy"
)

// buildKvgate builds cmd/kvgate once per test binary.
var buildKvgate = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "ingestbench-bin")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "kvgate")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/kvgate").CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/kvgate: %w\n%s", err, out)
	}
	return bin, nil
})

func TestMain(m *testing.M) {
	code := m.Run()
	if bin, err := buildKvgate(); err == nil {
		_ = os.RemoveAll(filepath.Dir(bin))
	}
	os.Exit(code)
}

// TestIngestBenchSmoke runs the benchmark small, with the real daemon and
// real libzmq publishers, so the command keeps working. It also checks the
// daemon's own ingest counters end to end: before kvgate counted live
// batches, kvgate_kv_subscriber_batches_total stayed 0 and the hash counter
// did not exist, so the stored and applied counts below were 0.
func TestIngestBenchSmoke(t *testing.T) {
	testpy.Require(t, "zmq", "msgpack")
	bin, err := buildKvgate()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		endpoints int
		tokens    bool
		churn     time.Duration
	}{
		{"hashes-4ep-churn", 4, false, 2 * time.Second},
		{"tokens-2ep", 2, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := run(config{kvgate: bin, repo: "../..", settle: 200 * time.Millisecond, endpoints: tc.endpoints, hashes: 50_000, batch: 256, tokens: tc.tokens,
				churn: tc.churn, churnRate: 200_000, sample: 200 * time.Millisecond},
				slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
			if err != nil {
				t.Fatal(err)
			}
			f := res.Fill
			// Every publisher's probe hash stays in the inventory beside the fill.
			if f.Blocks < res.Hashes || f.Blocks > res.Hashes+100*tc.endpoints {
				t.Errorf("inventory holds %d blocks after a fill of %d", f.Blocks, res.Hashes)
			}
			if f.StoredCounter != f.Blocks {
				t.Errorf("kvgate_kv_subscriber_hashes_total{event=stored} = %d, inventory %d blocks", f.StoredCounter, f.Blocks)
			}
			if f.HashesPerSec <= 0 || f.After.RSS <= 0 || f.After.HeapInuse <= 0 {
				t.Errorf("fill measured nothing: %+v", f)
			}
			if tc.churn == 0 {
				return
			}
			ch := res.Churn
			if ch == nil || ch.Published == 0 || ch.Applied != ch.Published {
				t.Fatalf("churn applied %+v", ch)
			}
			if ch.Blocks != f.Blocks {
				t.Errorf("churn changed the inventory size: %d -> %d blocks", f.Blocks, ch.Blocks)
			}
			if !ch.Flat {
				t.Errorf("RSS grew under churn: %+v", ch)
			}
		})
	}
}
