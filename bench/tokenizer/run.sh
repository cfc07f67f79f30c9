#!/bin/sh
# Runs kvgate's Go tokenizer benchmarks and the HuggingFace JS reference on the
# same inputs, interleaved round by round in one run (the machine's load then
# weighs on both alike), and prints per-case medians and the Go/JS ratio.
# Usage (from anywhere): bench/tokenizer/run.sh [rounds] [go-benchtime]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
rounds=${1:-5}
benchtime=${2:-10x}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
[ -d "$here/node_modules/@huggingface/tokenizers" ] || (cd "$here" && npm ci --no-audit --no-fund >/dev/null)
(cd "$here/../.." && go test -c -o "$out/tokenizer.test" ./pkg/tokenizer)
echo "go $(go env GOVERSION), @huggingface/tokenizers $(node -p "require('$here/node_modules/@huggingface/tokenizers/package.json').version"), node $(node --version), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
i=1
while [ "$i" -le "$rounds" ]; do
	(cd "$here/../../pkg/tokenizer" && "$out/tokenizer.test" -test.run XXX -test.bench 'WarAndPeace|LongPrompt' -test.benchtime "$benchtime") | grep '^Benchmark' >>"$out/go.txt"
	node "$here/bench.mjs" 1 >>"$out/js.txt"
	i=$((i + 1))
done
node "$here/summarize.mjs" "$out/go.txt" "$out/js.txt"
