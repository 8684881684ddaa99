#!/usr/bin/env bash
# pytest -m cuda (after the runtime default), then the c1 question: closed c1 at natural length (32 prompts, 1 round a pass), three servers built together, ABBA: 7e418aa, HEAD, HEAD with the float32 codec (the default before 2026-12-06).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 OMNIFLOW_COMMIT=$(cat .dev/commit)
nvidia-smi -L | tee $OUT/smi.txt
SECONDS=0
timeout 200 python3 -m pytest -m cuda -q tests/cuda > $OUT/cuda.txt 2>&1; echo "cuda rc=$? at $SECONDS s"; tail -4 $OUT/cuda.txt
S="model=qwen3_tts_1_7b platform=cuda pipeline=qwen3_tts_fused"
R=$OUT/r; mkdir -p $R
left=$((575 - SECONDS))
TOGETHER=1 ORDER=abba RATES="" CLOSED="1:32" ROUNDS=1 MAX_FRAMES=0 SERVE_ARGS="$S" \
  timeout $left bash benchmarks/open_loop_runs.sh $R "old,.dev/snap7e4" "new,." "fp32,.,model.codec_dtype=float32" ; echo "c1 rc=$? at $SECONDS s"
python3 -m benchmarks.open_loop_table $R > $OUT/table.md 2>&1; cat $OUT/table.md; cat $R/timing.txt
rm -f $R/*_requests.json; (cd $OUT && tar czf r.tgz r && rm -rf r)
