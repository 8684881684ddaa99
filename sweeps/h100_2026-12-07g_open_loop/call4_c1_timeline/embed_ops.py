"""How embed_ops.txt was made from the run's chrome trace (c1.b1.json.gz, 8.7 MB, not kept):
each host range of the embedding (`omniflow.talker.prefill_embed`, category user_annotation;
the trace repeats ranges on the GPU's timeline, left out) and its three longest host ops.

    python embed_ops.py c1.b1.json.gz > embed_ops.txt
"""

import gzip
import json
import sys
from pathlib import Path

events = json.loads(gzip.decompress(Path(sys.argv[1]).read_bytes()))["traceEvents"]
spans = [e for e in events if e.get("ph") == "X"]
print("Each prefill_embed host range of the span (ms) and its longest host ops (ms);")
print("the profiler's own overhead included.")
for e in spans:
    if e.get("cat") != "user_annotation" or e.get("name") != "omniflow.talker.prefill_embed":
        continue
    s, d, tid = e["ts"], e["dur"], e["tid"]
    inner = [
        x
        for x in spans
        if x.get("tid") == tid
        and x.get("cat") == "cpu_op"
        and s <= x["ts"] <= x["ts"] + x["dur"] <= s + d
    ]
    top = sorted(inner, key=lambda x: -x["dur"])[:3]
    ops = "; ".join(f"{x['name']} {x['dur'] / 1e3:.3f}" for x in top)
    print(f"prefill_embed {d / 1e3:.2f} ms: {ops}")
