#!/usr/bin/env bash
# chunks sent as decoded: hc against hc + audio_chunk_frames=2 and =4, built together, ABBA over hc/c2; 20 and 40 req/s (20 s after 5 s), c128 (1 round).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 OMNIFLOW_COMMIT=$(cat .dev/commit)
nvidia-smi -L | tee $OUT/smi.txt
R=$OUT/r; mkdir -p $R
TOGETHER=1 RATES="20 40" DURATION_S=20 WARMUP_S=5 CLOSED="128:512" ROUNDS=1 MAX_FRAMES=0 \
  SERVE_ARGS="model=qwen3_tts_1_7b platform=cuda pipeline=qwen3_tts_fused experiment=high_concurrency" \
  timeout 560 bash benchmarks/open_loop_runs.sh $R "hc,." "c2,.,pipeline.stages.talker.audio_chunk_frames=2" "c4,.,pipeline.stages.talker.audio_chunk_frames=4" ; echo rc=$?
python3 -m benchmarks.open_loop_table $R > $OUT/table.md 2>&1; cat $OUT/table.md; cat $R/timing.txt
for f in $R/*_rps40.metrics; do echo $f; grep -E "^omniflow_window_sizes|^omniflow_stalls_total" $f; done
(cd $OUT && tar czf r.tgz r && rm -rf r)
