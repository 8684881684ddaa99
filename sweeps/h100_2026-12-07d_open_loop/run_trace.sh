#!/usr/bin/env bash
# trace hc at 40 and 60 req/s (stalls, phase kinds), then 60 with synchronised phases.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 OMNIFLOW_COMMIT=$(cat .dev/commit)
nvidia-smi -L | tee $OUT/smi.txt
T="python3 -m benchmarks.open_loop_trace --model qwen3_tts_1_7b --platform cuda"
timeout 250 $T --rps 40 60 --seconds 20 --override experiment=high_concurrency --out $OUT/trace_hc.json > $OUT/trace_hc.txt 2>&1; echo rc=$?
grep -v "^stall" $OUT/trace_hc.txt | tail -60; grep "^stall" $OUT/trace_hc.txt | head -6 | cut -c1-700
timeout 170 $T --rps 60 --seconds 10 --sync-phases --override experiment=high_concurrency --out $OUT/trace_hc_sync.json > $OUT/trace_hc_sync.txt 2>&1; echo rc=$?
grep -v "^stall" $OUT/trace_hc_sync.txt | tail -40
gzip $OUT/*.json
