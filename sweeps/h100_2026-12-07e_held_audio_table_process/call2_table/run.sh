#!/usr/bin/env bash
# issue 34's table in one call: defaults at 1/10/20 req/s and hc at 40/60/80 (30 s after 5 s), then closed loop c1/c32/c128 at 50 frames (1 round) on both; built together.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 OMNIFLOW_COMMIT=$(cat .dev/commit)
nvidia-smi -L | tee $OUT/smi.txt
R=$OUT/r; mkdir -p $R/def $R/hc
S="model=qwen3_tts_1_7b platform=cuda pipeline=qwen3_tts_fused"
# two scripts at once would build together but measure at the same time: run the defaults' rates, then hc's, one server each
RATES="1 10 20" DURATION_S=30 WARMUP_S=5 CLOSED="1:32 32:128" ROUNDS=1 MAX_FRAMES=50 SERVE_ARGS="$S" \
  timeout 260 bash benchmarks/open_loop_runs.sh $R/def "def,." ; echo rc=$?
RATES="40 60 80" DURATION_S=30 WARMUP_S=5 CLOSED="1:32 32:128 128:512" ROUNDS=1 MAX_FRAMES=50 SERVE_ARGS="$S experiment=high_concurrency server.max_first_audio_wait_s=0.25" \
  timeout 300 bash benchmarks/open_loop_runs.sh $R/hc "hc,." ; echo rc=$?
for d in def hc; do python3 -m benchmarks.open_loop_table $R/$d; cat $R/$d/timing.txt; done > $OUT/table.md 2>&1; cat $OUT/table.md
rm -f $R/*/*_requests.json; (cd $OUT && tar czf r.tgz r && rm -rf r)
