#!/usr/bin/env bash
# the whole CUDA suite at HEAD.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 OMNIFLOW_COMMIT=$(cat .dev/commit)
nvidia-smi -L | tee $OUT/smi.txt
timeout 540 python3 -m pytest -m cuda -q -p no:cacheprovider tests/cuda --durations=15 > $OUT/cuda.txt 2>&1; echo rc=$?
tail -45 $OUT/cuda.txt
