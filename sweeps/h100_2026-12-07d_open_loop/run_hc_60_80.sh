#!/usr/bin/env bash
# hc at 60 and 80 req/s, 30 s each after 5 s (the highest rate; beyond capacity).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 OMNIFLOW_COMMIT=$(cat .dev/commit)
nvidia-smi -L | tee $OUT/smi.txt
R=$OUT/r; mkdir -p $R
RATES="60 80" DURATION_S=30 WARMUP_S=5 \
  SERVE_ARGS="model=qwen3_tts_1_7b platform=cuda pipeline=qwen3_tts_fused experiment=high_concurrency" \
  timeout 250 bash benchmarks/open_loop_runs.sh $R "hc,." ; echo rc=$?
python3 -m benchmarks.open_loop_table $R > $OUT/table.md 2>&1; cat $OUT/table.md; cat $R/timing.txt
grep -E "^omniflow_window_sizes|^omniflow_stalls_total" $R/hc_rps80.metrics
(cd $OUT && tar czf r.tgz r && rm -rf r)
