// Command ingest measures KV-event ingest end to end, as a user runs it: the
// real kvgate daemon (a built binary) subscribed to real libzmq publishers
// (/usr/bin/python3 with python3-zmq and python3-msgpack, publishing vLLM's
// map-layout KVEventBatch), one per endpoint of one KV rule. It pushes N
// unique block hashes, then churns (BlockRemoved of the oldest batch,
// BlockStored of a new one) at a target rate, and records the daemon's ingest
// rate from its own loxilb_pd_kv_blocks and kvgate_kv_seq_events_total
// counters, its VmRSS/VmHWM per hash, the Go heap and RSS over time.
// Results and their reading are in docs/ingest.md ("End to end").
//
//	go build -o /tmp/kvgate ./cmd/kvgate
//	go run ./bench/ingest --kvgate /tmp/kvgate --hashes 10000000 --endpoints 8 --churn 5m
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"
)

func main() {
	var c config
	var env string
	flag.StringVar(&c.kvgate, "kvgate", "", "kvgate binary (empty: go build ./cmd/kvgate into a temporary directory)")
	flag.StringVar(&c.repo, "repo", ".", "repository root (for the tokenizer, the publisher script and go build)")
	flag.IntVar(&c.endpoints, "endpoints", 8, "endpoints, one libzmq publisher each (1-64)")
	flag.IntVar(&c.hashes, "hashes", 1_000_000, "unique block hashes pushed in the fill, over all endpoints")
	flag.IntVar(&c.batch, "batch", 256, "block hashes per BlockStored/BlockRemoved event (one event per batch)")
	flag.BoolVar(&c.tokens, "tokens", false, "carry 16 token ids per block in BlockStored, as vLLM sends")
	flag.DurationVar(&c.churn, "churn", 0, "churn phase length (0: none)")
	flag.Float64Var(&c.churnRate, "churn-rate", 1_000_000, "churn target in hashes/s over all endpoints, stores plus removes (0: as fast as possible)")
	flag.DurationVar(&c.sample, "sample", time.Second, "RSS and metrics sampling interval")
	flag.StringVar(&c.series, "series", "", "write the RSS-over-time samples to this CSV file")
	flag.StringVar(&env, "env", "", "extra daemon environment, comma-separated KEY=VALUE (e.g. GOGC=50,GOMEMLIMIT=300MiB)")
	flag.Parse()
	if env != "" {
		c.env = strings.Split(env, ",")
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	res, err := run(c, log)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ingest:", err)
		os.Exit(1)
	}
	out, _ := json.MarshalIndent(res, "", "  ")
	fmt.Println(string(out))
	if res.Churn != nil && !res.Churn.Flat {
		fmt.Fprintln(os.Stderr, "ingest: RSS grew under churn")
		os.Exit(3)
	}
}
