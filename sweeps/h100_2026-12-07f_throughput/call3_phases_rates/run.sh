#!/usr/bin/env bash
# issue 35's sweep at HEAD through omniflow bench (result.json per job; hc, the engine process by the shipped null): c1/c32/c128 natural length 3 rounds; then the per-step breakdown (bench.phase_timing=device, which keeps the engine in-process); then hc at 40/60/80 req/s as time allows.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 OMNIFLOW_COMMIT=$(cat .dev/commit)
nvidia-smi -L | tee $OUT/smi.txt
S="model=qwen3_tts_1_7b platform=cuda pipeline=qwen3_tts_fused experiment=high_concurrency"
B="python3 -m omniflow bench -m $S bench.warmup=1 bench.concurrency=1,32,128"
SECONDS=0
timeout 200 $B bench.num_prompts=32 bench.prompts_per_lane=4 bench.rounds=3 hydra.sweep.dir=$OUT/throughput > $OUT/throughput.log 2>&1; echo "throughput rc=$? at $SECONDS s"
grep -E "audio-s/s|steady|first audio" $OUT/throughput.log | tail -12
timeout 170 $B bench.num_prompts=8 bench.prompts_per_lane=2 bench.rounds=1 bench.phase_timing=device hydra.sweep.dir=$OUT/phases > $OUT/phases.log 2>&1; echo "phases rc=$? at $SECONDS s"
grep -E "steps of|made, split|prefills" $OUT/phases.log | tail -20
left=$((540 - SECONDS))
R=$OUT/r; mkdir -p $R
RATES="40 60 80" DURATION_S=20 WARMUP_S=5 CLOSED="" SERVE_ARGS="$S" timeout $left bash benchmarks/open_loop_runs.sh $R "hc,." ; echo "rates rc=$? at $SECONDS s"
python3 -m benchmarks.open_loop_table $R > $OUT/table.md 2>&1; cat $OUT/table.md; cat $R/timing.txt
rm -f $R/*_requests.json; (cd $OUT && tar czf r.tgz r && rm -rf r)
