#!/usr/bin/env bash
# defaults (no experiment) at 1, 10, 20 req/s, 30 s each after 5 s.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 OMNIFLOW_COMMIT=$(cat .dev/commit)
nvidia-smi -L | tee $OUT/smi.txt
R=$OUT/r; mkdir -p $R
RATES="1 10 20" DURATION_S=30 WARMUP_S=5 \
  SERVE_ARGS="model=qwen3_tts_1_7b platform=cuda pipeline=qwen3_tts_fused" \
  timeout 330 bash benchmarks/open_loop_runs.sh $R "def,." ; echo rc=$?
python3 -m benchmarks.open_loop_table $R > $OUT/table.md 2>&1; cat $OUT/table.md; cat $R/timing.txt
grep -E "^omniflow_window_sizes|^omniflow_stalls_total" $R/def_rps20.metrics
(cd $OUT && tar czf r.tgz r && rm -rf r)
