#!/usr/bin/env bash
# issue 35's process move: hc in-process against hc with pipeline.runtime=process, built together, closed c128 at natural length (512 prompts, 1 round each), then 40 req/s if time is left.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 OMNIFLOW_COMMIT=$(cat .dev/commit)
nvidia-smi -L | tee $OUT/smi.txt
R=$OUT/r; mkdir -p $R
TOGETHER=1 RATES="" CLOSED="128:512" ROUNDS=1 MAX_FRAMES=0 \
  SERVE_ARGS="model=qwen3_tts_1_7b platform=cuda pipeline=qwen3_tts_fused experiment=high_concurrency" \
  timeout 215 bash benchmarks/open_loop_runs.sh $R "inproc,." "proc,.,pipeline.runtime=process" ; echo rc=$?
python3 -m benchmarks.open_loop_table $R > $OUT/table.md 2>&1; cat $OUT/table.md; cat $R/timing.txt
grep -h "engine process\|Traceback\|Error" $R/serve_proc.log | head -5
(cd $OUT && tar czf r.tgz r && rm -rf r)
