#!/usr/bin/env bash
# one call (carry .whl, this script, .dev/commit, .dev/snap7e4, .dev/snapd39): the new CUDA tests; then 7e418aa (old), d391268 (rows: padded text rows, before audio ahead) and HEAD (new), built together, ABBA: the defaults at 1 req/s (20 s after 5 s) and closed c1 (32 prompts, natural length).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 OMNIFLOW_COMMIT=$(cat .dev/commit)
nvidia-smi -L | tee $OUT/smi.txt
SECONDS=0
timeout 170 python3 -m pytest -m cuda -q tests/cuda/test_audio_ahead_cuda.py tests/cuda/test_codec_graph_cuda.py tests/cuda/test_text_rows_cuda.py tests/cuda/test_prefill_sync_cuda.py tests/cuda/test_sampling_sync_cuda.py > $OUT/cuda.txt 2>&1; echo "cuda rc=$? at $SECONDS s"; tail -15 $OUT/cuda.txt
S="model=qwen3_tts_1_7b platform=cuda pipeline=qwen3_tts_fused"
R=$OUT/r; mkdir -p $R
left=$((588 - SECONDS))
TOGETHER=1 ORDER=abba RATES="1" DURATION_S=20 WARMUP_S=5 CLOSED="1:32" ROUNDS=1 MAX_FRAMES=0 SERVE_ARGS="$S" \
  timeout $left bash benchmarks/open_loop_runs.sh $R "old,.dev/snap7e4" "rows,.dev/snapd39" "new,." ; echo "runs rc=$? at $SECONDS s"
python3 -m benchmarks.open_loop_table $R > $OUT/table.md 2>&1; cat $OUT/table.md; cat $R/timing.txt
rm -f $R/*_requests.json; (cd $OUT && tar czf r.tgz r && rm -rf r)
