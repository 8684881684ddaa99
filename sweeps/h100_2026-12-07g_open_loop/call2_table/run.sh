#!/usr/bin/env bash
# issue 34's table in one call (the engine process as shipped): the defaults at 1/10/20 req/s (30 s after 5 s) with closed c1/c32 at natural length, then hc at 40/60 req/s with closed c128 (512 prompts), 1 round each.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 OMNIFLOW_COMMIT=$(cat .dev/commit)
nvidia-smi -L | tee $OUT/smi.txt
SECONDS=0
S="model=qwen3_tts_1_7b platform=cuda pipeline=qwen3_tts_fused"
R=$OUT/r; mkdir -p $R/def $R/hc
RATES="1 10 20" DURATION_S=30 WARMUP_S=5 CLOSED="1:32 32:128" ROUNDS=1 MAX_FRAMES=0 SERVE_ARGS="$S" \
  timeout 290 bash benchmarks/open_loop_runs.sh $R/def "def,." ; echo "def rc=$? at $SECONDS s"
left=$((575 - SECONDS))
RATES="40 60" DURATION_S=30 WARMUP_S=5 CLOSED="128:512" ROUNDS=1 MAX_FRAMES=0 SERVE_ARGS="$S experiment=high_concurrency" \
  timeout $left bash benchmarks/open_loop_runs.sh $R/hc "hc,." ; echo "hc rc=$? at $SECONDS s"
for d in def hc; do python3 -m benchmarks.open_loop_table $R/$d; cat $R/$d/timing.txt; done > $OUT/table.md 2>&1; cat $OUT/table.md
rm -f $R/*/*_requests.json; (cd $OUT && tar czf r.tgz r && rm -rf r)
