#!/usr/bin/env bash
# Runs every Go fuzz target of the module for FUZZTIME each (default 10s), and
# fails if any target finds a failing input. A new failing input is written
# under the package's testdata/fuzz/<Target>/ by Go itself: commit it as a
# regression case once the bug is fixed.
#
# FUZZJOBS targets run at once (default: one per two CPUs, at least one), each
# with FUZZJOBS-th of the machine's fuzz workers, so every target still fuzzes
# for the whole FUZZTIME and the step's wall time is divided by FUZZJOBS
# (docs/benchmarks.md "CI").
#
#   scripts/fuzz.sh                          # every target, 10 s each
#   FUZZTIME=10m FUZZJOBS=1 scripts/fuzz.sh  # the long runs recorded in docs/benchmarks.md
#   scripts/fuzz.sh ./pkg/kvevents           # one package's targets
set -euo pipefail
cd "$(dirname "$0")/.."

fuzztime=${FUZZTIME:-10s}
go=${GO:-go}
cpus=$(nproc 2>/dev/null || echo 1)
jobs=${FUZZJOBS:-$(( cpus >= 2 ? 2 : 1 ))}
workers=$(( cpus / jobs ))
[ "$workers" -ge 1 ] || workers=1
pkgs=("$@")
if [ "${#pkgs[@]}" -eq 0 ]; then
  mapfile -t pkgs < <(grep -rl --include='*_test.go' '^func Fuzz' . | xargs -n1 dirname | sort -u)
fi

# fuzz_one PKG TARGET runs one target and prints its log only on failure.
fuzz_one() {
  local pkg=$1 t=$2 log try
  log=$(mktemp)
  echo "fuzz $pkg $t ($fuzztime, $workers workers)"
  # Go's fuzz coordinator can end a clean run with a bare "context deadline
  # exceeded" and no failing input (go.dev/issue/75804); only that exact
  # signature is retried, once. Any other failure, or a written input, fails.
  for try in 1 2; do
    if $go test -run '^$' -fuzz "^${t}\$" -fuzztime "$fuzztime" -parallel "$workers" "$pkg" >"$log" 2>&1; then
      rm -f "$log"
      return 0
    fi
    if [ "$try" -eq 1 ] && grep -q 'context deadline exceeded' "$log" && ! grep -q 'Failing input written' "$log"; then
      echo "  retrying $t once: fuzz coordinator deadline race, no failing input"
      continue
    fi
    echo "fuzz: $pkg $t failed:"
    cat "$log"
    rm -f "$log"
    return 1
  done
}
export -f fuzz_one
export fuzztime go workers

# Every (package, target) pair first, then FUZZJOBS of them at a time.
pairs=()
for pkg in "${pkgs[@]}"; do
  for t in $($go test -list '^Fuzz' "$pkg" | grep '^Fuzz' || true); do
    pairs+=("$pkg" "$t")
  done
done
if [ "${#pairs[@]}" -eq 0 ]; then
  echo "fuzz: no targets" >&2
  exit 1
fi
if printf '%s\0' "${pairs[@]}" | xargs -0 -n 2 -P "$jobs" bash -c 'fuzz_one "$1" "$2"' _; then
  echo "fuzz: $(( ${#pairs[@]} / 2 )) targets ran for $fuzztime each without a failure"
  exit 0
fi
echo "fuzz: a target failed" >&2
exit 1
