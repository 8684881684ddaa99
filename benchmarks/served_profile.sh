#!/usr/bin/env bash
# Where a served closed-loop load spends the interpreter and the GPU: one `omniflow serve`
# (SERVE_ARGS), a warm round of the load generator, then a measured round during which
# py-spy samples which threads hold the GIL (`--threads --gil`, SECONDS_RECORDED s from 2 s
# in) and nvidia-smi reads the GPU's utilisation every 100 ms. Needs py-spy on PATH and, for
# the GPU reading, nvidia-smi. Issue 35's "measure the HTTP side at c128".
#   SERVE_ARGS="model=qwen3_tts_1_7b platform=cuda pipeline=qwen3_tts_fused experiment=high_concurrency pipeline.runtime=in_process" \
#     CONCURRENCY=128 PROMPTS=512 bash benchmarks/served_profile.sh OUT
# Writes OUT/serve.log, OUT/round{1,2}.json (the load generator's summaries), OUT/gil.txt
# (py-spy's raw stacks), OUT/util.txt, and prints the per-thread GIL table
# (`benchmarks.thread_share`) and the mean utilisation. It samples the server's process: the
# engine shares it with `pipeline.runtime=in_process`, the default here (on CUDA the null
# would put the engine in a process of its own, out of the samples).
set -euo pipefail
out=$(mkdir -p "$1" && cd "$1" && pwd)
serve_args=${SERVE_ARGS:-model=qwen3_tts_1_7b platform=cuda pipeline=qwen3_tts_fused experiment=high_concurrency pipeline.runtime=in_process}
port=${PORT:-8123}
recorded=${SECONDS_RECORDED:-6}
rate=200
python3 -m omniflow serve $serve_args server.port=$port > "$out/serve.log" 2>&1 &
pid=$!
trap 'kill -INT $pid 2>/dev/null || true' EXIT
for _ in $(seq 600); do
  grep -q "omniflow ready" "$out/serve.log" && break
  kill -0 $pid 2>/dev/null || { echo "the server died: $out/serve.log" >&2; exit 1; }
  sleep 0.5
done
load() {
  python3 -m omniflow.bench.client --url "http://127.0.0.1:$port" --model "${MODEL:-qwen3-tts-12hz-1.7b-customvoice}" \
    --concurrency "${CONCURRENCY:-128}" --num-prompts "${PROMPTS:-512}" --max-frames "${MAX_FRAMES:-0}" \
    --warmup 1 --out "$out/$1.json" > /dev/null || [ $? -eq 3 ]  # 3: ran, some requests failed
}
load round1
(sleep 2; py-spy record --pid $pid --rate $rate --duration "$recorded" --threads --gil --nonblocking \
  --format raw -o "$out/gil.txt" > "$out/pyspy.log" 2>&1) &
spy=$!
(sleep 2; timeout "$recorded" nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits \
  -lms 100 > "$out/util.txt" 2>&1 || true) &
smi=$!
load round2
wait $spy || echo "py-spy failed: $out/pyspy.log" >&2
wait $smi || true
python3 -m benchmarks.thread_share "$out/gil.txt" --rate $rate --duration "$recorded"
python3 -c "import sys; v=[float(x) for x in open(sys.argv[1]) if x.strip().replace('.','',1).isdigit()]; print(f'GPU utilisation: mean {sum(v)/len(v):.1f} % over {len(v)} readings' if v else 'no GPU reading')" "$out/util.txt"
