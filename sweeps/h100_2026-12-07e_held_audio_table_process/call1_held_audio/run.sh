#!/usr/bin/env bash
# held frames: cuda tests, the codec pass at 128 rows for 1/2/4/8 frames, then hc vs hc+audio_pass_steps=4 (built together): open loop 40/60 req/s and closed c128 natural length.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 OMNIFLOW_COMMIT=$(cat .dev/commit)
nvidia-smi -L | tee $OUT/smi.txt
timeout 80 python3 -m pytest -m cuda -q -s tests/cuda/test_audio_passes_cuda.py 2>&1 | grep -E "frames:|passed|failed|Error" | tee $OUT/cuda.txt
for f in 1 4; do
  timeout 35 python3 -m benchmarks.graph_trace --graph codec --batch 128 --frames $f --reps 20 --traced 1 --out $OUT/codec_b128f$f.json > $OUT/codec_f$f.log 2>&1; echo "frames $f rc=$?"; grep -iE "wall|replay" $OUT/codec_f$f.log | head -3
done
R=$OUT/r; mkdir -p $R
TOGETHER=1 RATES="40" DURATION_S=30 WARMUP_S=5 CLOSED="128:512" ROUNDS=1 MAX_FRAMES=0 \
  SERVE_ARGS="model=qwen3_tts_1_7b platform=cuda pipeline=qwen3_tts_fused experiment=high_concurrency" \
  timeout 260 bash benchmarks/open_loop_runs.sh $R "hc,." "aps4,.,pipeline.stages.talker.audio_pass_steps=4" ; echo rc=$?
python3 -m benchmarks.open_loop_table $R > $OUT/table.md 2>&1; cat $OUT/table.md; cat $R/timing.txt
grep -H "^omniflow_window_audio_cycles_total\|^omniflow_window_steps_total\|^omniflow_window_executed_total" $R/*.metrics | grep -v before
rm -f $R/*_requests.json; (cd $OUT && tar czf r.tgz r && rm -rf r)
