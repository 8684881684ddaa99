#!/usr/bin/env bash
# issue 35's sweep at HEAD through omniflow bench, result.json per job (hc, the engine process): c128 and c1 at natural length, 3 rounds; the job folders tarred.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 OMNIFLOW_COMMIT=$(cat .dev/commit)
nvidia-smi -L | tee $OUT/smi.txt
S="model=qwen3_tts_1_7b platform=cuda pipeline=qwen3_tts_fused experiment=high_concurrency"
timeout 330 python3 -m omniflow bench -m $S bench.warmup=1 bench.concurrency=128,32,1 bench.num_prompts=32 bench.prompts_per_lane=4 bench.rounds=3 hydra.sweep.dir=$OUT/throughput > $OUT/throughput.log 2>&1; echo "throughput rc=$? at $SECONDS s"
grep -E "round|first audio, server" $OUT/throughput.log | tail -14
(cd $OUT && tar czf throughput.tgz throughput && rm -rf throughput)
