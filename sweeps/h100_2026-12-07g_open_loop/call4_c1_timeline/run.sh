#!/usr/bin/env bash
# the defaults' c1 timeline (no syncs), requests 4-7 of 8 at natural length; kernels attributed to the phase that launched them (phase_gpu in c1.json).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 OMNIFLOW_COMMIT=$(cat .dev/commit)
timeout 160 python3 -m benchmarks.talker_baseline --model qwen3_tts_1_7b --platform cuda --pipeline qwen3_tts_fused --frames 0 --batch 1 --requests 8 --timeline $OUT/c1 --timeline-span 3 4 --out $OUT/c1.json > $OUT/c1.log 2>&1
