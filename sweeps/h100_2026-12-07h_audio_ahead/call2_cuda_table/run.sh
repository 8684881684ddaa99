#!/usr/bin/env bash
# the whole pytest -m cuda; then HEAD's open-loop table: defaults at 1/10/20 req/s, hc at 40 (20 s after 5 s each)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 OMNIFLOW_COMMIT=$(cat .dev/commit)
nvidia-smi -L | tee $OUT/smi.txt
SECONDS=0
timeout 230 python3 -m pytest -m cuda -q tests/cuda > $OUT/cuda.txt 2>&1; echo "cuda rc=$? at $SECONDS s"; tail -6 $OUT/cuda.txt
S="model=qwen3_tts_1_7b platform=cuda pipeline=qwen3_tts_fused"
R=$OUT/r; mkdir -p $R/def $R/hc
RATES="1 10 20" DURATION_S=20 WARMUP_S=5 SERVE_ARGS="$S" timeout $((400 - SECONDS)) bash benchmarks/open_loop_runs.sh $R/def "def,." ; echo "def rc=$? at $SECONDS s"
RATES="40" DURATION_S=20 WARMUP_S=5 SERVE_ARGS="$S experiment=high_concurrency" timeout $((580 - SECONDS)) bash benchmarks/open_loop_runs.sh $R/hc "hc,." ; echo "hc rc=$? at $SECONDS s"
for d in def hc; do python3 -m benchmarks.open_loop_table $R/$d; cat $R/$d/timing.txt; done > $OUT/table.md 2>&1; cat $OUT/table.md
rm -f $R/*/*_requests.json; (cd $OUT && tar czf r.tgz r && rm -rf r)
