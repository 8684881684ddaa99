#!/usr/bin/env bash
# next session, call 1: experiment=high_concurrency without a hold against hold 120 ms from 96 running streams (limit 0.3 s): both servers built together (TOGETHER=1), then each measured twice, ABBA: 40 req/s open loop, then closed c128 natural (512 prompts, 2 rounds).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 OMNIFLOW_COMMIT=$(cat .dev/commit 2>/dev/null || echo unknown)
nvidia-smi -L | tee $OUT/smi.txt
R=$OUT/r; mkdir -p $R
t0=$(date +%s); el() { echo "$1 rc=$2 after $(( $(date +%s)-t0 )) s" | tee -a $OUT/timing.txt; }
H="pipeline.stages.talker.scheduler.arrival_hold_ms=120 pipeline.stages.talker.scheduler.arrival_hold_min_running=96 server.max_first_audio_wait_s=0.3"
# the no-hold side names the hold off: since 5b0e0b5 experiment=high_concurrency holds on platform=cuda
A="hc,.,server.max_first_audio_wait_s=0.3 pipeline.stages.talker.scheduler.arrival_hold_ms=0 pipeline.stages.talker.scheduler.arrival_hold_min_running=1"; B="hold96,.,$H"
TOGETHER=1 ORDER=abba RATES="40" DURATION_S=20 WARMUP_S=5 CLOSED="128:512" ROUNDS=2 MAX_FRAMES=0 \
  SERVE_ARGS="model=qwen3_tts_1_7b platform=cuda pipeline=qwen3_tts_fused experiment=high_concurrency" \
  timeout 560 bash benchmarks/open_loop_runs.sh $R "$A" "$B"; el ab $?
python3 -m benchmarks.open_loop_table $R > $OUT/table.md 2>&1; cat $OUT/table.md; cat $R/timing.txt
(cd $OUT && tar czf r.tgz r && rm -rf r)
