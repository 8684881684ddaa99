#!/usr/bin/env bash
# served, built together: hc (experiment=high_concurrency) against c4 (the same + audio_chunk_frames=4: windows sized by the first chunk): 40 req/s (15 s after 3 s), then c128 closed loop at natural length (512 prompts, 1 round).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 OMNIFLOW_COMMIT=$(cat .dev/commit)
nvidia-smi -L | tee $OUT/smi.txt
R=$OUT/r; mkdir -p $R
TOGETHER=1 RATES="40" DURATION_S=15 WARMUP_S=3 CLOSED="128:512" ROUNDS=1 MAX_FRAMES=0 \
  SERVE_ARGS="model=qwen3_tts_1_7b platform=cuda pipeline=qwen3_tts_fused experiment=high_concurrency" \
  timeout 300 bash benchmarks/open_loop_runs.sh $R "hc,." "c4,.,pipeline.stages.talker.audio_chunk_frames=4" ; echo rc=$?
python3 -m benchmarks.open_loop_table $R > $OUT/table.md 2>&1; cat $OUT/table.md; cat $R/timing.txt
grep -h -i -E "warm-up|ready|built in|captured" $R/serve_*.log | head -24
for f in $R/*_rps40.metrics; do echo $f; grep -E "^omniflow_window|^omniflow_stalls" $f | head -30; done
(cd $OUT && tar czf r.tgz r && rm -rf r)
