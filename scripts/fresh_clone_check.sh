#!/usr/bin/env bash
# A newcomer's first minutes, replayed: a fresh clone in a fresh venv, the README's set-up,
# then `omniflow synth text="Hello there." out=x.wav` (must finish in under 10 s with under
# 3 s of audio), then a normal, non-editable `pip install .` running `omniflow config` from
# outside the clone (so the configuration must ship inside the package).
#
#   scripts/fresh_clone_check.sh             # clone this repository's HEAD
#   scripts/fresh_clone_check.sh --worktree  # copy the working tree instead (uncommitted work)
#
# Not part of CI (.ci/run): it installs torch and the dev tools into two new venvs, which
# takes minutes. It prints each step's wall time and exits non-zero on the first failure.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
step() { printf '\n== %s\n' "$*"; }
clock() { local t0=$SECONDS; "$@"; echo "   ($((SECONDS - t0)) s)"; }

step "fresh copy of the repository in $work/omniflow"
if [[ "${1:-}" == "--worktree" ]]; then
  mkdir "$work/omniflow"
  (cd "$repo" && git ls-files -z --cached --others --exclude-standard |
    xargs -0 -I{} cp --parents {} "$work/omniflow/" 2>/dev/null || true)
else
  git clone -q "$repo" "$work/omniflow"
fi
cd "$work/omniflow"

step "README set-up: a venv, torch, then omniflow with the dev tools"
clock python3 -m venv "$work/venv"
# shellcheck disable=SC1091
source "$work/venv/bin/activate"
clock python -m pip install -q -r requirements-torch.txt
clock python -m pip install -q -e ".[dev]"

step 'omniflow synth text="Hello there." out=x.wav'
t0=$(date +%s.%N)
omniflow synth text="Hello there." out=x.wav
wall=$(python -c "import time; print(f'{time.time() - $t0:.2f}')")
audio=$(python -c "import soundfile; print(f'{soundfile.info(\"x.wav\").duration:.2f}')")
echo "   synth took ${wall} s for ${audio} s of audio"
python -c "import sys; sys.exit(not ($wall < 10 and $audio < 3))" ||
  { echo "FAIL: wanted < 10 s wall and < 3 s of audio"; exit 1; }

step "non-editable install (pip install .) in a second venv, then omniflow config"
deactivate
python3 -m venv "$work/venv2"
# shellcheck disable=SC1091
source "$work/venv2/bin/activate"
clock python -m pip install -q -r requirements-torch.txt
clock python -m pip install -q .
cd "$work"  # outside the clone: only the installed package can be imported
omniflow config pipeline=qwen3_tts platform=cpu | head -5
python -c "import omniflow, pathlib; p = pathlib.Path(omniflow.__file__).parent; \
assert 'site-packages' in str(p), p; assert (p / 'conf' / 'config.yaml').is_file(); print('  from', p)"
echo
echo "fresh clone check: OK"
