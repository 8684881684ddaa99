#!/usr/bin/env bash
# issue 34's table at the issue's protocol (10 s warm-up, 30 s measured): default fused pipeline vs experiment=high_concurrency + hold 120 ms from 96 running (limit 0.3), 1/10/20/40 req/s, built together, measured a then b.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 OMNIFLOW_COMMIT=$(cat .dev/commit 2>/dev/null || echo unknown)
nvidia-smi -L | tee $OUT/smi.txt
R=$OUT/r; mkdir -p $R
H="pipeline.stages.talker.scheduler.arrival_hold_ms=120 pipeline.stages.talker.scheduler.arrival_hold_min_running=96 server.max_first_audio_wait_s=0.3"
A="default,.,"; B="hold96,.,experiment=high_concurrency $H"
TOGETHER=1 RATES="1 10 20 40" DURATION_S=30 WARMUP_S=10 \
  SERVE_ARGS="model=qwen3_tts_1_7b platform=cuda pipeline=qwen3_tts_fused" \
  timeout 570 bash benchmarks/open_loop_runs.sh $R "$A" "$B"; echo rc=$?
python3 -m benchmarks.open_loop_table $R > $OUT/table.md 2>&1; cat $OUT/table.md; cat $R/timing.txt
(cd $OUT && tar czf r.tgz r && rm -rf r)
