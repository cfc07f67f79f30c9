#!/usr/bin/env bash
# kvgate's linters: gofmt, go vet, staticcheck and golangci-lint (the linter
# set and limits are in .golangci.yml). The tools are pinned below and
# installed with `go install` (through the Go module proxy) into $LINT_BIN
# (default .lint/bin, git-ignored) when that exact version is missing, so the
# first run builds them (a few minutes) and later runs reuse them.
#
#   scripts/lint.sh              lint every package
#   scripts/lint.sh ./pkg/foo/...  lint some packages
#
# Every linter runs even when an earlier one fails; the exit status is 1 if
# any reported a finding.
set -euo pipefail
cd "$(dirname "$0")/.."

# Both support go 1.26 (go.mod's version): staticcheck 2026.2.2 and
# golangci-lint v2.15.0 are built with, and type-check, the local toolchain.
STATICCHECK_VERSION=v0.8.2
GOLANGCI_LINT_VERSION=v2.15.0

bin=${LINT_BIN:-$PWD/.lint/bin}
pkgs=("$@")
[ ${#pkgs[@]} -gt 0 ] || pkgs=(./...)

# tool NAME MODULE_PATH VERSION: prints the path of NAME at VERSION, installing
# it into its own versioned directory first if needed.
tool() {
	local name=$1 mod=$2 ver=$3 dir="$bin/$1@$3"
	if [ ! -x "$dir/$name" ]; then
		echo "lint: installing $mod@$ver into $dir" >&2
		mkdir -p "$dir"
		GOBIN="$dir" go install "$mod@$ver" >&2
	fi
	printf '%s\n' "$dir/$name"
}

staticcheck=$(tool staticcheck honnef.co/go/tools/cmd/staticcheck "$STATICCHECK_VERSION")
golangci=$(tool golangci-lint github.com/golangci/golangci-lint/v2/cmd/golangci-lint "$GOLANGCI_LINT_VERSION")

status=0
run() {
	echo "lint: $*" >&2
	"$@" || status=1
}

# Generated bpf2go files are skipped, as `make fmt` does.
unformatted=$(gofmt -l $(git ls-files '*.go' | grep -v '_bpfe[lb]\.go$'))
if [ -n "$unformatted" ]; then
	echo "lint: gofmt needed:" >&2
	printf '%s\n' "$unformatted"
	status=1
fi
run go vet "${pkgs[@]}"
run "$staticcheck" "${pkgs[@]}"
run "$golangci" run "${pkgs[@]}"
exit "$status"
