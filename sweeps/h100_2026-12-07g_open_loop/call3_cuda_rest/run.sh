#!/usr/bin/env bash
# the CUDA tests call 1 did not reach in its 200 s (tests.txt: the 33 after the first 41 of `pytest -m cuda --collect-only tests/cuda`)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 OMNIFLOW_COMMIT=$(cat .dev/commit)
timeout 270 python3 -m pytest -q $(cat tests.txt)
