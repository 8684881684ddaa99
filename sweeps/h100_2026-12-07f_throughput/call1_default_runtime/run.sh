#!/usr/bin/env bash
# issue 34/35: the defaults in-process against the defaults with pipeline.runtime=process, built together: 1/10/20 req/s (30 s after 5 s), then closed c1 at natural length (32 prompts, 1 round).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 OMNIFLOW_COMMIT=$(cat .dev/commit)
nvidia-smi -L | tee $OUT/smi.txt
R=$OUT/r; mkdir -p $R
S="model=qwen3_tts_1_7b platform=cuda pipeline=qwen3_tts_fused"
TOGETHER=1 RATES="1 10 20" DURATION_S=30 WARMUP_S=5 CLOSED="1:32" ROUNDS=1 MAX_FRAMES=0 SERVE_ARGS="$S" \
  timeout 470 bash benchmarks/open_loop_runs.sh $R "inproc,." "proc,.,pipeline.runtime=process" ; echo rc=$?
python3 -m benchmarks.open_loop_table $R > $OUT/table.md 2>&1; cat $OUT/table.md; cat $R/timing.txt
grep -h "engine process\|Traceback\|Error" $R/serve_*.log | head -5
rm -f $R/*_requests.json; (cd $OUT && tar czf r.tgz r && rm -rf r)
