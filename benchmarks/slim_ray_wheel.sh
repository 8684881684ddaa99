#!/usr/bin/env bash
# A Ray wheel small enough for the GPU machine's 64 MiB per call (docs/deploy.md, "One GPU"):
# the official cp312 manylinux wheel (79 MB) without the Java workers (ray/jars), the
# dashboard's web UI, RLlib and type stubs, its three binaries' symbol tables stripped
# (backtraces then show addresses), repacked with `wheel` (RECORD regenerated) under the
# official file name. ~38 MB.
#   benchmarks/slim_ray_wheel.sh ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl OUT_DIR
# Needs `python3 -m wheel` (pip install wheel) and binutils' strip.
set -euo pipefail
src=$(realpath "$1"); out=$(realpath "$2"); py=${PYTHON:-python3}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
"$py" -m wheel unpack -d "$work" "$src" >/dev/null
cd "$work"/ray-*/
rm -rf ray/jars ray/dashboard/client ray/rllib
find ray -name '*.pyi' -delete
strip --strip-unneeded ray/_raylet.so ray/core/src/ray/gcs/gcs_server ray/core/src/ray/raylet/raylet
mkdir -p "$work/packed"
"$py" -m wheel pack -d "$work/packed" . >/dev/null
"$py" - "$work/packed" "$out" "$(basename "$src")" <<'PY'
import glob, os, sys, zipfile
packed, out, name = sys.argv[1:]
src = glob.glob(os.path.join(packed, "*.whl"))[0]
dst = os.path.join(out, name)  # the official name: the same tags
with zipfile.ZipFile(src) as zi, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zo:
    for info in zi.infolist():
        zo.writestr(info, zi.read(info), compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
print(dst, os.path.getsize(dst))
PY
