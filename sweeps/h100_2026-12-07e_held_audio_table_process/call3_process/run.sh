#!/usr/bin/env bash
# issue 35's process question: c128 at natural length (512 prompts, 2 rounds), served (hc) then in-process (the same config), one call, one card.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 OMNIFLOW_COMMIT=$(cat .dev/commit)
nvidia-smi -L | tee $OUT/smi.txt
R=$OUT/r; mkdir -p $R
RATES="" CLOSED="128:512" ROUNDS=2 MAX_FRAMES=0 \
  SERVE_ARGS="model=qwen3_tts_1_7b platform=cuda pipeline=qwen3_tts_fused experiment=high_concurrency" \
  timeout 280 bash benchmarks/open_loop_runs.sh $R "hc,." ; echo rc=$?
python3 -m benchmarks.open_loop_table $R > $OUT/table.md 2>&1; cat $OUT/table.md
timeout 280 python3 -m benchmarks.in_process_lanes --model qwen3_tts_1_7b --platform cuda \
  --override experiment=high_concurrency --concurrency 128 --prompts 512 --rounds 2 --out $OUT/lanes.json 2>&1 | grep -v Warn | tail -5
(cd $OUT && tar czf r.tgz r && rm -rf r)
