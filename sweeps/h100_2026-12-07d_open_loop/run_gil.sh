#!/usr/bin/env bash
# GIL switch interval: hc vs 0.5 ms (two servers: three OOM at build) at 40 req/s (30 s) and c128.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 OMNIFLOW_COMMIT=$(cat .dev/commit)
nvidia-smi -L | tee $OUT/smi.txt
R=$OUT/r; mkdir -p $R
TOGETHER=1 RATES="40" DURATION_S=30 WARMUP_S=5 CLOSED="128:512" ROUNDS=1 MAX_FRAMES=0 \
  SERVE_ARGS="model=qwen3_tts_1_7b platform=cuda pipeline=qwen3_tts_fused experiment=high_concurrency" \
  timeout 560 bash benchmarks/open_loop_runs.sh $R "hc,." "si05,.,server.gil_switch_interval_ms=0.5" ; echo rc=$?
python3 -m benchmarks.open_loop_table $R > $OUT/table.md 2>&1; cat $OUT/table.md; cat $R/timing.txt
for f in $R/*_rps40.metrics; do echo $f; grep -E "^omniflow_window_sizes|^omniflow_stalls_total" $f; done
(cd $OUT && tar czf r.tgz r && rm -rf r)
