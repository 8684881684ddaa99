#!/usr/bin/env bash
# closed loop, fixed length (50 frames), experiment=high_concurrency: c1 (32 prompts), c32 (128), c128 (512), 2 rounds.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 OMNIFLOW_COMMIT=$(cat .dev/commit)
nvidia-smi -L | tee $OUT/smi.txt
R=$OUT/r; mkdir -p $R
RATES="" CLOSED="1:32 32:128 128:512" ROUNDS=2 MAX_FRAMES=50 \
  SERVE_ARGS="model=qwen3_tts_1_7b platform=cuda pipeline=qwen3_tts_fused experiment=high_concurrency" \
  timeout 220 bash benchmarks/open_loop_runs.sh $R "hc,." ; echo rc=$?
python3 -m benchmarks.open_loop_table $R > $OUT/table.md 2>&1; cat $OUT/table.md; cat $R/timing.txt
rm -f $R/*_requests.json; (cd $OUT && tar czf r.tgz r && rm -rf r)
