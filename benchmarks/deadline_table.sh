#!/usr/bin/env bash
# Issue 34's whole table from one build of this tree, in one device call: the defaults at 1, 10
# and 20 req/s then closed c1 (32 prompts) and c32 (128); `experiment=high_concurrency` at 40,
# 60 and 80 req/s (past capacity: refusals and how fast) then closed c128 (512). Each rate
# DURATION_S (30) measured after WARMUP_S (5); closed jobs ROUNDS (3) rounds of MAX_FRAMES (50)
# frames a prompt. Writes OUT/def and OUT/hc (`benchmarks/open_loop_runs.sh`'s files) and
# OUT/table.md (`benchmarks.open_loop_table` of both, with each server's timing).
#   bash benchmarks/deadline_table.sh out/
# DEFAULT_RATES, HC_RATES, DEFAULT_CLOSED, HC_CLOSED override the rates and the closed jobs;
# SERVE_ARGS the served model and platform (default: the 1.7B shapes on CUDA, fused).
set -euo pipefail
out=$(mkdir -p "$1" && cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
tree=$(cd "$here/.." && pwd)
serve=${SERVE_ARGS:-model=qwen3_tts_1_7b platform=cuda pipeline=qwen3_tts_fused}
export DURATION_S=${DURATION_S:-30} WARMUP_S=${WARMUP_S:-5} ROUNDS=${ROUNDS:-3}
RATES=${DEFAULT_RATES-1 10 20} CLOSED=${DEFAULT_CLOSED-1:32 32:128} SERVE_ARGS="$serve" \
  bash "$here/open_loop_runs.sh" "$out/def" "def,$tree" || echo "defaults: exit $?" >&2
RATES=${HC_RATES-40 60 80} CLOSED=${HC_CLOSED-128:512} \
  SERVE_ARGS="$serve experiment=high_concurrency" \
  bash "$here/open_loop_runs.sh" "$out/hc" "hc,$tree" || echo "hc: exit $?" >&2
for part in def hc; do  # a part that failed still leaves the other's rows
  (cd "$tree" && python3 -m benchmarks.open_loop_table "$out/$part") || true
  cat "$out/$part/timing.txt" || true
done > "$out/table.md" 2>&1
cat "$out/table.md"
