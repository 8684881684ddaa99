#!/usr/bin/env bash
# issue 35's sweep: hc at 7e418aa (the issue's baseline) against hc at HEAD (engine process), built together, closed c1/c32/c128 at natural length, 3 rounds each.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 OMNIFLOW_COMMIT=$(cat .dev/commit)
nvidia-smi -L | tee $OUT/smi.txt
R=$OUT/r; mkdir -p $R
S="model=qwen3_tts_1_7b platform=cuda pipeline=qwen3_tts_fused"
TOGETHER=1 RATES="" CLOSED="1:32 32:128 128:512" ROUNDS=3 MAX_FRAMES=0 SERVE_ARGS="$S experiment=high_concurrency" \
  timeout 470 bash benchmarks/open_loop_runs.sh $R "old,.dev/snap7e4" "new,." ; echo rc=$?
python3 -m benchmarks.open_loop_table $R > $OUT/table.md 2>&1; cat $OUT/table.md; cat $R/timing.txt
grep -h "engine process\|Traceback\|Error" $R/serve_*.log | head -5
(cd $OUT && tar czf r.tgz r && rm -rf r)
