#!/usr/bin/env bash
# Open-loop first audio and stalls of two trees' servers, one after the other on one GPU:
# the same seeded arrivals from this tree's load generator (omniflow/bench/open_client.py)
# against `omniflow serve` of each tree (the older one may predate the open-loop bench).
#   benchmarks/open_loop_ab.sh OLD_TREE NEW_TREE OUT_DIR [RATES...]
# Each tree is imported through PYTHONPATH; extra server overrides via SERVE_ARGS.
set -euo pipefail
old=$1 new=$2 out=$3; shift 3
rates=${*:-10 20}
client=$(cd "$(dirname "$0")/.." && pwd)
serve_args=${SERVE_ARGS:-model=qwen3_tts_1_7b platform=cuda pipeline=qwen3_tts_fused}
mkdir -p "$out"
port=8101
for tree in "$old" "$new"; do
  name=$(basename "$tree")
  PYTHONPATH="$tree:${PYTHONPATH:-}" python3 -m omniflow serve $serve_args \
    server.port=$port > "$out/serve_$name.log" 2>&1 &
  pid=$!
  for _ in $(seq 600); do grep -q "omniflow ready" "$out/serve_$name.log" && break; sleep 0.5; done
  for rps in $rates; do
    PYTHONPATH="$client:${PYTHONPATH:-}" python3 -m omniflow.bench.open_client \
      --url "http://127.0.0.1:$port" --rps "$rps" --duration-s "${DURATION_S:-20}" \
      --warmup-s "${WARMUP_S:-5}" --drain-s 30 --model qwen3-tts-12hz-1.7b-customvoice \
      > "$out/${name}_rps$rps.json" 2> "$out/${name}_rps$rps.err" || true
  done
  kill -INT $pid; wait $pid || true
  port=$((port + 1))
done
