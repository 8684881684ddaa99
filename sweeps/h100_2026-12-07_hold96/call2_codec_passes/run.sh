#!/usr/bin/env bash
# next session: what an audio pass costs per frame by its length (the lever of decoding slack-rich streams' frames in longer passes, whatever cut the window): the codec decoder graph's replay at 16/64/128 rows x 1/2/4/8 frames, float16 (the CUDA default)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 OMNIFLOW_COMMIT=$(cat .dev/commit 2>/dev/null || echo unknown)
nvidia-smi -L | tee $OUT/smi.txt
R=$OUT/r; mkdir -p $R
for b in 128 64 16; do for f in 1 2 4 8; do
  timeout 60 python3 -m benchmarks.graph_trace --graph codec --batch $b --frames $f --reps 30 --traced 2 --out $R/codec_b${b}_f${f}.json > $R/codec_b${b}_f${f}.log 2>&1
  echo "b=$b f=$f rc=$?: $(grep -m1 -i 'replay' $R/codec_b${b}_f${f}.log)"
done; done | tee $OUT/summary.txt
(cd $OUT && tar czf r.tgz r && rm -rf r)
