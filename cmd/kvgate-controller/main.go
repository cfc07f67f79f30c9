// Command kvgate-controller is the experimental AI controller: it scrapes the
// registry's vLLM engines and streams per-endpoint weight advice to kvgate
// gateways over gRPC (docs/controller.md). Every flag falls back to an
// AICTRL_* environment variable (--epoch-period-sec: AICTRL_EPOCH_PERIOD_SEC).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"

	"github.com/kvgate/kvgate/pkg/aictrl"
	pb "github.com/kvgate/kvgate/pkg/aictrl/aictrlpb"
	"github.com/kvgate/kvgate/pkg/aictrl/controller"
)

type flags struct {
	grpcAddr, metricsAddr, registry   string
	epochSec, scrapeSec, staleSec     int
	alpha, deadBand, maxStep          float64
	tlsCert, tlsKey, clientCA, logLvl string
	insecure                          bool
	// epochSet: --epoch-period-sec or its variable was given; otherwise
	// the registry's epoch_period_sec is the period.
	epochSet bool
}

func parse(args []string, getenv func(string) string, stderr io.Writer) (flags, error) {
	var f flags
	fs := pflag.NewFlagSet("kvgate-controller", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.grpcAddr, "grpc-addr", ":18856", "AiCtrl gRPC listen address")
	fs.StringVar(&f.metricsAddr, "metrics-addr", ":18857", "Prometheus /metrics listen address")
	fs.StringVar(&f.registry, "registry", "/etc/loxilb/ai-controller.yaml", "registry YAML (strict; SIGHUP reloads it)")
	fs.IntVar(&f.epochSec, "epoch-period-sec", 10, "seconds between snapshots, overriding the registry's epoch_period_sec; the staleness deadline is 3 epochs")
	fs.IntVar(&f.scrapeSec, "scrape-interval-sec", 5, "seconds between scrapes of each host's /metrics")
	fs.IntVar(&f.staleSec, "stale-budget-sec", 15, "a host not scraped for this long is stale")
	fs.Float64Var(&f.alpha, "ewma-alpha", 0.3, "EWMA weight of each epoch's raw weight, (0,1]")
	fs.Float64Var(&f.deadBand, "dead-band", 5, "weight changes smaller than this are not emitted")
	fs.Float64Var(&f.maxStep, "max-step-pct", 20, "largest weight change per epoch, in weight points")
	fs.StringVar(&f.tlsCert, "tls-cert", "", "serve gRPC over TLS 1.2+ with this certificate (PEM; reloads)")
	fs.StringVar(&f.tlsKey, "tls-key", "", "the --tls-cert key (PEM; mode 0600 or 0400)")
	fs.StringVar(&f.clientCA, "tls-client-ca", "", "require gateways to present a certificate signed by this CA (mTLS)")
	fs.BoolVar(&f.insecure, "insecure", false, "allow plaintext gRPC beyond loopback")
	fs.StringVar(&f.logLvl, "log-level", "info", "debug|info|warn|error")
	var envErr error
	fs.VisitAll(func(fl *pflag.Flag) {
		name := "AICTRL_" + strings.ToUpper(strings.ReplaceAll(fl.Name, "-", "_"))
		if v := getenv(name); v != "" && envErr == nil {
			if err := fl.Value.Set(v); err != nil {
				envErr = fmt.Errorf("%s=%q: %w", name, v, err)
			}
			f.epochSet = f.epochSet || fl.Name == "epoch-period-sec"
		}
	})
	if envErr != nil {
		return f, envErr
	}
	if err := fs.Parse(args); err != nil {
		return f, err
	}
	f.epochSet = f.epochSet || fs.Changed("epoch-period-sec")
	if f.epochSec < 1 || f.epochSec > 3600 {
		return f, fmt.Errorf("--epoch-period-sec %d: want 1..3600", f.epochSec)
	}
	if f.scrapeSec < 1 || f.scrapeSec > 3600 {
		return f, fmt.Errorf("--scrape-interval-sec %d: want 1..3600", f.scrapeSec)
	}
	if f.staleSec < 1 || f.staleSec > 86400 {
		return f, fmt.Errorf("--stale-budget-sec %d: want 1..86400", f.staleSec)
	}
	if !(f.alpha > 0 && f.alpha <= 1) {
		return f, fmt.Errorf("--ewma-alpha %v: want (0,1]", f.alpha)
	}
	if f.deadBand < 0 || f.deadBand > 100 || f.maxStep < 0 || f.maxStep > 100 {
		return f, errors.New("--dead-band and --max-step-pct: want 0..100")
	}
	return f, nil
}

func main() {
	if err := run(context.Background(), os.Args[1:], os.Getenv, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "kvgate-controller:", err)
		os.Exit(2)
	}
}

func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	f, err := parse(args, getenv, stderr)
	if err != nil {
		return err
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(f.logLvl)); err != nil {
		return fmt.Errorf("--log-level %q: %w", f.logLvl, err)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lvl}))
	reg, err := controller.LoadRegistry(f.registry)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	creds, tlsState, err := aictrl.ServerCredentials(aictrl.ServerTLS{Addr: f.grpcAddr, CertFile: f.tlsCert,
		KeyFile: f.tlsKey, ClientCAFile: f.clientCA, Insecure: f.insecure, Log: log})
	if err != nil {
		return err
	}
	if tlsState != nil {
		go tlsState.Run(ctx)
	}
	preg := prometheus.NewRegistry()
	preg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	epoch := time.Duration(reg.EpochPeriodSec) * time.Second
	if f.epochSet {
		epoch = time.Duration(f.epochSec) * time.Second
	}
	c, err := controller.New(reg, controller.Options{
		EpochPeriod:    epoch,
		ScrapeInterval: time.Duration(f.scrapeSec) * time.Second,
		StaleBudget:    time.Duration(f.staleSec) * time.Second,
		Law:            controller.Law{Alpha: f.alpha, DeadBand: f.deadBand, MaxStep: f.maxStep},
		Registry:       preg, Log: log,
	})
	if err != nil {
		return err
	}
	gln, err := net.Listen("tcp", f.grpcAddr)
	if err != nil {
		return fmt.Errorf("--grpc-addr: %w", err)
	}
	mln, err := net.Listen("tcp", f.metricsAddr)
	if err != nil {
		gln.Close()
		return fmt.Errorf("--metrics-addr: %w", err)
	}
	gs := grpc.NewServer(grpc.Creds(creds), grpc.MaxRecvMsgSize(64<<10), grpc.KeepaliveEnforcementPolicy(aictrl.KeepaliveEnforcement()))
	pb.RegisterAiCtrlServer(gs, controller.NewServer(c))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(preg, promhttp.HandlerOpts{}))
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go gs.Serve(gln)
	go hs.Serve(mln)
	go c.Run(ctx)

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	log.Info("kvgate-controller started", "grpc", gln.Addr().String(), "metrics", mln.Addr().String(),
		"boot_id", c.BootID(), "service", reg.Service.Key, "hosts", len(reg.Hosts), "epoch", epoch, "tls", tlsState != nil)
	for {
		select {
		case <-ctx.Done():
			log.Info("kvgate-controller stopping")
			gs.Stop()
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return hs.Shutdown(sctx)
		case <-hup:
			// A bad file keeps the registry in force, so a typo never
			// empties the fleet.
			if next, err := controller.LoadRegistry(f.registry); err != nil {
				log.Error("registry reload failed; keeping the current one", "err", err)
			} else {
				c.SetRegistry(next)
				log.Info("registry reloaded", "hosts", len(next.Hosts))
			}
		}
	}
}
