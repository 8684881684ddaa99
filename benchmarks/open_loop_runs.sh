#!/usr/bin/env bash
# Open-loop first audio and stalls of several servers, one after the other on one GPU: the
# same seeded arrivals from this tree's load generator (omniflow/bench/open_client.py)
# against `omniflow serve` of each variant. A variant is LABEL,TREE[,OVERRIDES]: a tree
# (a directory holding `omniflow/`, e.g. `git archive REV omniflow | tar x -C DIR`; the
# server runs from it, and an older one may predate the open-loop bench) and server
# overrides on top of SERVE_ARGS (the served model's name in MODEL; a server that dies is
# noted in timing.txt and skipped).
#   RATES="10 20" benchmarks/open_loop_runs.sh OUT_DIR old,snap_old new,snap k0,snap,pipeline.stages.talker.window_k=0
# RATES: the open-loop rates, one after the other (default "10 20"; set and empty: none, for
# closed-loop rounds only). Per variant and rate: LABEL_rpsR.json (the summary, with the server's build from /health:
# `server.tree` must differ between two trees), LABEL_rpsR_requests.json (every request with
# its chunk timeline), LABEL_rpsR.metrics (the server's /metrics after it; .before.metrics:
# before it, so the table can say where that rate's first audio went on the server).
# CLOSED="1:32 32:128 128:512" adds closed-loop rounds on the same server after the rates
# (concurrency:prompts, ROUNDS rounds each, MAX_FRAMES frames a prompt, default 50; one
# warm-up request): LABEL_cC_rN.json. `python -m benchmarks.open_loop_table OUT` makes the
# table of both. ORDER=abba runs the variants forward, then backward (labels LABEL_1 and
# LABEL_2), so that which server ran first on the machine, an effect as large as some
# differences measured (docs/performance.md), cancels.
# TOGETHER=1 starts every variant's server at once (each on its own port; the GPU must hold
# them all) and measures them one after the other, in ORDER, on those servers: the builds
# (minutes on a GPU) overlap, and ORDER=abba measures each server twice without building it
# again. An idle server takes no GPU time, but the builds share the GPU while cuDNN times its
# algorithms: compare variants started together with each other, not with solo starts.
# A label given twice or a tree without omniflow/ is refused before any server starts; on any
# exit the servers still running are stopped (INT, then TERM and KILL if one does not end).
set -euo pipefail
out=$(mkdir -p "$1" && cd "$1" && pwd); shift
rates=${RATES-10 20}  # RATES="" (set, empty): closed-loop rounds only
client=$(cd "$(dirname "$0")/.." && pwd)
serve_args=${SERVE_ARGS:-model=qwen3_tts_1_7b platform=cuda pipeline=qwen3_tts_fused}
runs=("$@")
if [ "${ORDER:-}" = abba ]; then  # each variant first once and last once: order effects cancel
  runs=()
  for variant in "$@"; do runs+=("1:$variant"); done
  for ((i = $#; i >= 1; i--)); do runs+=("2:${!i}"); done
elif [ -n "${ORDER:-}" ]; then
  echo "ORDER=${ORDER}: only ORDER=abba (or unset) is known" >&2; exit 2
fi
if [ -n "${TOGETHER:-}" ] && [ "$TOGETHER" != 1 ]; then
  echo "TOGETHER=${TOGETHER}: only TOGETHER=1 (or unset) is known" >&2; exit 2
fi
declare -A pids ports seen
for variant in "$@"; do  # every variant checked before any server starts
  IFS=, read -r label tree _ <<< "$variant"
  if [ -n "${seen[$label]:-}" ]; then echo "the label $label is given twice" >&2; exit 2; fi
  if [ ! -d "$tree/omniflow" ]; then echo "$label: $tree holds no omniflow/" >&2; exit 2; fi
  seen[$label]=1
done
running() {  # PID: the process is there and has not exited (an exited child is a zombie)
  local state
  state=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
  [[ $state != Z* ]]
}

cleanup() {  # on any exit: the servers this script started and has not stopped yet
  local label pid sig
  for label in "${!pids[@]}"; do
    pid=${pids[$label]}
    # INT as a server expects; one sent before the server's interpreter started can be lost
    # (the subshell execs it), so TERM and then KILL follow where it does not end
    for sig in INT TERM KILL; do
      running "$pid" || break
      kill -$sig "$pid" 2>/dev/null || break
      for _ in $(seq 100); do running "$pid" || break 2; sleep 0.1; done
    done
  done
  wait || true
}
trap cleanup EXIT

start() {  # LABEL TREE OVERRIDES PORT: a server in the background, its pid in pids[LABEL]
  local tree
  tree=$(cd "$2" && pwd)
  # run from the tree: `python -m` puts the working directory ahead of PYTHONPATH
  (cd "$tree" && PYTHONPATH="$tree:${PYTHONPATH:-}" exec python3 -m omniflow serve $serve_args \
    ${3:-} server.port=$4) > "$out/serve_$1.log" 2>&1 &
  pids[$1]=$!
  ports[$1]=$4
}

died() {  # LABEL: true (noted in timing.txt, reaped, forgotten) when its server has ended
  running "${pids[$1]}" && return 1
  echo "$1 died after $SECONDS s (serve_$1.log)" >> "$out/timing.txt"
  wait "${pids[$1]}" || true
  unset "pids[$1]"
}

ready() {  # LABEL: wait until its server is ready (0) or has died (1, noted in timing.txt)
  for _ in $(seq 600); do
    grep -q "omniflow ready" "$out/serve_$1.log" && break
    running "${pids[$1]}" || break  # it died (a bad tree or override): its log says why
    sleep 0.5
  done
  died "$1" && return 1
  echo "$1 ready after $SECONDS s" >> "$out/timing.txt"
}

measure() {  # LABEL PORT: the rates, then the closed-loop jobs, on that server
  local label=$1 port=$2
  for rps in $rates; do
    python3 -c "import httpx,sys; print(httpx.get(sys.argv[1]).text)" \
      "http://127.0.0.1:$port/metrics" > "$out/${label}_rps${rps}.before.metrics" || true
    (cd "$client" && PYTHONPATH="$client:${PYTHONPATH:-}" exec python3 -m omniflow.bench.open_client \
      --url "http://127.0.0.1:$port" --rps "$rps" --duration-s "${DURATION_S:-20}" \
      --warmup-s "${WARMUP_S:-5}" --drain-s 30 --model "${MODEL:-qwen3-tts-12hz-1.7b-customvoice}" \
      --out "$out/${label}_rps${rps}_requests.json") \
      > "$out/${label}_rps$rps.json" 2> "$out/${label}_rps$rps.err" || true
    python3 -c "import httpx,sys; print(httpx.get(sys.argv[1]).text)" \
      "http://127.0.0.1:$port/metrics" > "$out/${label}_rps$rps.metrics" || true
  done
  for job in ${CLOSED:-}; do
    IFS=: read -r conc prompts <<< "$job"
    for round in $(seq "${ROUNDS:-1}"); do
      (cd "$client" && PYTHONPATH="$client:${PYTHONPATH:-}" exec python3 -m omniflow.bench.client \
        --url "http://127.0.0.1:$port" --num-prompts "$prompts" --concurrency "$conc" \
        --max-frames "${MAX_FRAMES:-50}" --warmup 1 --model "${MODEL:-qwen3-tts-12hz-1.7b-customvoice}" \
        --out "$out/${label}_c${conc}_r$round.json") > /dev/null 2> "$out/${label}_c${conc}_r$round.err" || true
    done
  done
}

stop() {  # LABEL
  kill -INT "${pids[$1]}" 2>/dev/null || true
  wait "${pids[$1]}" || true
  unset "pids[$1]"
  echo "$1 done after $SECONDS s" >> "$out/timing.txt"
}

port=8101
if [ "${TOGETHER:-}" = 1 ]; then
  for variant in "$@"; do
    IFS=, read -r label tree overrides <<< "$variant"
    start "$label" "$tree" "${overrides:-}" $port
    port=$((port + 1))
  done
  for variant in "$@"; do ready "${variant%%,*}" || true; done
  for variant in "${runs[@]}"; do
    pass=""
    if [ "${ORDER:-}" = abba ]; then pass=_${variant%%:*}; variant=${variant#*:}; fi
    label=${variant%%,*}
    [ -n "${pids[$label]:-}" ] || continue  # it died
    died "$label" && continue  # since it was ready
    measure "$label$pass" "${ports[$label]}"
    echo "$label$pass measured after $SECONDS s" >> "$out/timing.txt"
  done
  for label in "${!pids[@]}"; do stop "$label"; done
  exit 0
fi
for variant in "${runs[@]}"; do
  pass=""
  if [ "${ORDER:-}" = abba ]; then pass=_${variant%%:*}; variant=${variant#*:}; fi
  IFS=, read -r label tree overrides <<< "$variant"
  label=$label$pass
  start "$label" "$tree" "${overrides:-}" $port
  port=$((port + 1))
  ready "$label" || continue
  measure "$label" "${ports[$label]}"
  stop "$label"
done
