package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	env := map[string]string{"AICTRL_EPOCH_PERIOD_SEC": "3", "AICTRL_EWMA_ALPHA": "0.5"}
	f, err := parse([]string{"--dead-band", "2"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if f.epochSec != 3 || !f.epochSet || f.alpha != 0.5 || f.deadBand != 2 || f.grpcAddr != ":18856" || f.metricsAddr != ":18857" ||
		f.registry != "/etc/loxilb/ai-controller.yaml" || f.scrapeSec != 5 || f.staleSec != 15 || f.maxStep != 20 {
		t.Fatalf("%+v", f)
	}
	if f, _ := parse(nil, func(string) string { return "" }, io.Discard); f.epochSet {
		t.Fatal("epoch marked set without flag or variable: the registry's period must apply")
	}
	// A flag beats its variable.
	if f, _ := parse([]string{"--epoch-period-sec", "7"}, func(k string) string { return env[k] }, io.Discard); f.epochSec != 7 {
		t.Fatalf("flag did not win: %d", f.epochSec)
	}
	bad := []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--epoch-period-sec", "0"}, nil, "--epoch-period-sec"},
		{[]string{"--ewma-alpha", "0"}, nil, "--ewma-alpha"},
		{[]string{"--dead-band", "-1"}, nil, "--dead-band"},
		{nil, map[string]string{"AICTRL_SCRAPE_INTERVAL_SEC": "soon"}, "AICTRL_SCRAPE_INTERVAL_SEC"},
		{[]string{"--nope"}, nil, "unknown flag"},
	}
	for _, b := range bad {
		_, err := parse(b.args, func(k string) string { return b.env[k] }, io.Discard)
		if err == nil || !strings.Contains(err.Error(), b.want) {
			t.Fatalf("%v %v: err %v want %q", b.args, b.env, err, b.want)
		}
	}
}

func TestRunRefuses(t *testing.T) {
	dir := t.TempDir()
	good, err := os.ReadFile("../../pkg/aictrl/controller/testdata/registry-good.yaml")
	if err != nil {
		t.Fatal(err)
	}
	reg := filepath.Join(dir, "r.yaml")
	if err := os.WriteFile(reg, good, 0o644); err != nil {
		t.Fatal(err)
	}
	broken := filepath.Join(dir, "b.yaml")
	if err := os.WriteFile(broken, append(good, []byte("extra: 1\n")...), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--registry", filepath.Join(dir, "missing.yaml")}, "no such file"},
		{[]string{"--registry", broken}, "field extra not found"},
		{[]string{"--registry", reg, "--grpc-addr", ":0"}, "beyond loopback"},
		{[]string{"--registry", reg, "--grpc-addr", "127.0.0.1:0", "--tls-cert", "c.pem"}, "go together"},
	}
	for _, c := range cases {
		err := run(context.Background(), c.args, func(string) string { return "" }, io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%v: err %v want %q", c.args, err, c.want)
		}
	}
}
