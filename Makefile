# kvgate build entry points. `make test` is the command CI runs (.ci/run).
GO        ?= go
PKGS      ?= ./...
TESTFLAGS ?= -count=1 -timeout 15m
BENCH     ?= .
BENCHTIME ?= 1s

.PHONY: all build test race fuzz bench bench-routing bench-routing-full bench-tiers generate lint fmt demo clean

all: build

build:
	$(GO) build $(PKGS)
	$(GO) build -o bin/ ./cmd/...

# Every test, then one rerun of a package that failed (reported as FLAKY):
# scripts/test.sh. `go test ./...` runs them plainly.
test:
	GO=$(GO) scripts/test.sh $(TESTFLAGS) $(PKGS)

# The race detector over the library packages (CI runs it; see docs/benchmarks.md for its cost).
# -short trims the data-heavy loops (bulk body sizes, corpus rounds), which
# make test runs in full; every test still runs.
RACEPKGS  ?= ./pkg/...
race:
	GO=$(GO) scripts/test.sh -race -short -count=1 -timeout 20m $(RACEPKGS)

# Every fuzz target for FUZZTIME each, FUZZJOBS at a time (CI: 10s, two at
# once on two CPUs; the long runs are benchmarks, FUZZJOBS=1).
FUZZTIME  ?= 10s
FUZZJOBS  ?=
fuzz:
	FUZZTIME=$(FUZZTIME) FUZZJOBS=$(FUZZJOBS) GO=$(GO) scripts/fuzz.sh

bench:
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchmem -benchtime $(BENCHTIME) $(PKGS)

# Every routing policy side by side on simulated fleets (docs/routing-benchmark.md), ~8 min.
bench-routing:
	$(GO) run ./bench/routing -mode quick

# The full sweep in the background (720 points, ~89 min, resumable); progress in bench/routing/out/full.log.
bench-routing-full:
	mkdir -p bench/routing/out && nohup $(GO) run ./bench/routing -mode full > bench/routing/out/full.log 2>&1 &

# Tier-aware vs GPU-only scoring with enginesim CPU offload tiers (docs/selection.md), ~2 min.
bench-tiers:
	$(GO) run ./bench/tiers

# Rebuilds the committed bpf2go output; needs Debian's clang, llvm and libbpf-dev.
generate:
	$(GO) generate ./...

# gofmt, go vet, staticcheck and golangci-lint at pinned versions (scripts/lint.sh
# installs them into .lint/bin on first use; .golangci.yml has the linter set).
lint:
	./scripts/lint.sh

fmt:
	gofmt -w $$(git ls-files '*.go' | grep -v '_bpfe[lb].go$$')

demo:
	$(GO) run ./cmd/kvgate demo

clean:
	rm -rf bin
