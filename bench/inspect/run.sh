#!/usr/bin/env bash
# Hostile-prompt cost through the real daemon: N concurrent one-word prompts of
# SIZE MiB to a KV rule over one enginesim engine (byte tokenizer), then the
# daemon's RSS at its peak (VmHWM), right after, and AFTER seconds later, plus
# the latency of a small request sent while the big ones are in flight.
# Usage: bench/inspect/run.sh [kvgate-binary] [N=4] [SIZE=15] [AFTER=30]
# Loopback only (127.77.0.0/24). Results: docs/tokenizer.md, "Bounds".
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${1:-}
N=${2:-4}
SIZE=${3:-15}
AFTER=${4:-30}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
if [ -z "$BIN" ]; then
	go build -o "$work/kvgate" ./cmd/kvgate
	BIN=$work/kvgate
fi
go build -o "$work/enginesim" ./cmd/enginesim
mkdir -p "$work/tok" && ln -s "$PWD/pkg/tokenizer/testdata/qwen3" "$work/tok/Qwen__Qwen3-0.6B"
PYTHONHASHSEED=0 "$work/enginesim" --host 127.77.0.11 --port 18000 --kv-events-endpoint tcp://127.77.0.11:15557 \
	--max-request-bytes 67108864 --decode-tokens-per-s 0 --log-level warn >"$work/engine.log" 2>&1 &
LLB_KV_NONE_HASH_SEED=0 "$BIN" --api 127.77.0.2:11111 --state-dir "$work/state" --tokenizer-dir "$work/tok" \
	--datapath userspace --log-level warn >"$work/kvgate.log" 2>&1 &
pid=$!
for _ in $(seq 100); do curl -sf -o /dev/null http://127.77.0.2:11111/netlox/v1/config/loadbalancer/all && break; sleep 0.1; done
curl -sf -o /dev/null -X POST http://127.77.0.2:11111/netlox/v1/config/loadbalancer -d '{"serviceArguments":{"externalIP":"127.77.0.1","port":8080,"protocol":"tcp","sel":0,"mode":4,"kvExactMode":3,"kvZmqPort":15557,"kvHashAlgo":"sha256_cbor","kvBlockSize":16},"endpoints":[{"endpointIP":"127.77.0.11","targetPort":18000,"weight":1}]}'
python3 -c "import json,sys; sys.stdout.write(json.dumps({'model':'Qwen/Qwen3-0.6B','max_tokens':1,'prompt':'a'*($SIZE<<20)}))" >"$work/big.json"
rss() { awk -v k="$1" '$1==k":" {print int($2/1024)}' /proc/$pid/status; }
small() {
	curl -s -o /dev/null -w "$1: %{http_code} %{time_total}s\n" -H 'Content-Type: application/json' \
		-d '{"model":"Qwen/Qwen3-0.6B","max_tokens":1,"prompt":"hello there"}' http://127.77.0.1:8080/v1/completions
}
small "warm-up (loads the tokenizer)"
small "small request, idle"
echo "idle RSS $(rss VmRSS) MiB"
start=$(date +%s.%N)
big=()
for i in $(seq "$N"); do
	curl -s -o /dev/null -w "big $i: %{http_code} %{time_total}s\n" -H 'Content-Type: application/json' \
		--data-binary @"$work/big.json" http://127.77.0.1:8080/v1/completions &
	big+=($!)
done
sleep 0.5
small "small request during the burst"
wait "${big[@]}"
echo "burst took $(echo "$(date +%s.%N) - $start" | bc)s"
echo "peak RSS (VmHWM) $(rss VmHWM) MiB, RSS now $(rss VmRSS) MiB"
sleep "$AFTER"
echo "RSS ${AFTER}s later $(rss VmRSS) MiB"
curl -s http://127.77.0.2:11111/netlox/v1/metrics | grep -E '^kvgate_(kv_skip|panics)_total' | grep -v ' 0$' || true
kill -0 $pid && echo "kvgate alive"
