"""Make the reference fixtures: the official qwen-tts outputs omniflow is compared with.

    python3 scripts/make_reference_fixtures.py                      # tiny preset (committed)
    python3 scripts/make_reference_fixtures.py --preset qwen3_tts_tiny_voicedesign  # committed
    python3 scripts/make_reference_fixtures.py --preset qwen3_tts_0_6b --out OUT_DIR

Needs the official package beside omniflow (tests/reference/official.py says how to install
it). For a preset it builds the official model and speech tokenizer from the preset's shapes,
re-draws every tensor by name (tests/reference/weights.py), saves them with the official
classes in the published layout, and records under tests/reference/fixtures/<preset>/ (a
VoiceDesign preset: the official VoiceDesign model and its cases, official_design.py):

    config.json, speech_tokenizer_config.json   the config files the official classes wrote
    keys.json                                   every tensor name and shape they saved
    outputs.safetensors                         inputs and official outputs (cases.py)
    meta.json                                   command, package versions, seed, fingerprints

No weights are committed: the tests draw the same tensors for the same names. CI reads the
fixtures (tests/reference/test_reference_fixtures.py); docs/reference.md describes them.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from omniflow.config.compose import compose  # noqa: E402
from omniflow.config.resolve import build_graph  # noqa: E402
from tests.reference import official, official_design  # noqa: E402
from tests.reference.cases import FIXTURES, GREEDY_MAX_NEW_TOKENS, SEED  # noqa: E402
from tests.reference.weights import draw_all, fingerprint  # noqa: E402


def saved_shapes(path: Path) -> dict[str, list[int]]:
    with safe_open(str(path), framework="pt") as f:
        return {k: list(f.get_slice(k).get_shape()) for k in sorted(f.keys())}  # noqa: SIM118


def make(preset: str, out_dir: Path, command: str) -> None:
    torch.manual_seed(0)
    model = build_graph(compose(["platform=cpu", f"model={preset}"])).model
    side = official_design if model.voice_design else official
    tts, codec = side.build(model, SEED)
    target = out_dir / preset
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        saved = Path(tmp)
        official.save(tts, codec, saved)
        talker_keys = saved_shapes(saved / "model.safetensors")
        codec_keys = saved_shapes(saved / "speech_tokenizer" / "model.safetensors")
        shutil.copy(saved / "config.json", target / "config.json")
        shutil.copy(
            saved / "speech_tokenizer" / "config.json", target / "speech_tokenizer_config.json"
        )
    (target / "keys.json").write_text(json.dumps({"talker": talker_keys, "codec": codec_keys}))
    tensors = side.outputs(tts, codec, model)
    save_file(tensors, str(target / "outputs.safetensors"))
    decoder = {k: v for k, v in codec_keys.items() if k.startswith("decoder.")}
    meta = {
        "preset": preset,
        "command": command,
        "versions": official.versions(),
        "seed": SEED,
        "fingerprints": {
            "talker": fingerprint(draw_all({k: tuple(v) for k, v in talker_keys.items()}, SEED)),
            "decoder": fingerprint(draw_all({k: tuple(v) for k, v in decoder.items()}, SEED)),
        },
        "greedy_frames": {
            key.split("/")[1]: int(value.shape[0])
            for key, value in tensors.items()
            if key.startswith("greedy/")
        },
        "greedy_max_new_tokens": GREEDY_MAX_NEW_TOKENS,
    }
    (target / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    size = sum(p.stat().st_size for p in target.iterdir())
    print(f"wrote {target} ({size / 1e6:.2f} MB, {len(tensors)} tensors)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen3_tts_tiny", help="a conf/model preset name")
    parser.add_argument("--out", type=Path, default=FIXTURES, help="fixtures root directory")
    args = parser.parse_args()
    command = "python3 scripts/make_reference_fixtures.py " + " ".join(sys.argv[1:])
    make(args.preset, args.out, command.strip())


if __name__ == "__main__":
    main()
