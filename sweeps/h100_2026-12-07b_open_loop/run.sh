#!/usr/bin/env bash
# experiment=high_concurrency as shipped: 10 and 20 req/s (30 s after 10 s), then closed-loop c128 at natural length (512 prompts, 2 rounds, steady state).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 OMNIFLOW_COMMIT=$(cat .dev/commit)
nvidia-smi -L | tee $OUT/smi.txt
R=$OUT/r; mkdir -p $R
RATES="10 20" DURATION_S=30 WARMUP_S=10 CLOSED="128:512" ROUNDS=2 MAX_FRAMES=0 \
  SERVE_ARGS="model=qwen3_tts_1_7b platform=cuda pipeline=qwen3_tts_fused experiment=high_concurrency" \
  timeout 330 bash benchmarks/open_loop_runs.sh $R "hc,." ; echo rc=$?
python3 -m benchmarks.open_loop_table $R > $OUT/table.md 2>&1; cat $OUT/table.md; cat $R/timing.txt
(cd $OUT && tar czf r.tgz r && rm -rf r)
