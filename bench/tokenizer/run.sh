#!/bin/sh
# Runs kvgate's Go tokenizer benchmarks and the HuggingFace JS reference on
# the same inputs, back to back in one run, so the ratios are measured under
# the same machine load. Usage (from the repository root):
#   bench/tokenizer/run.sh [go-bench-count] [js-rounds]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
count=${1:-5}
rounds=${2:-5}
[ -d "$here/node_modules/@huggingface/tokenizers" ] || (cd "$here" && npm ci --no-audit --no-fund >/dev/null)
echo "== go (pkg/tokenizer), -count $count"
(cd "$here/../.." && go test -run XXX -bench 'WarAndPeace|LongPrompt' -count "$count" ./pkg/tokenizer | grep '^Benchmark')
echo "== js (@huggingface/tokenizers $(node -p "require('$here/node_modules/@huggingface/tokenizers/package.json').version"), node $(node --version)), $rounds rounds, median"
node "$here/bench.mjs" "$rounds"
