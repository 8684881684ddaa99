"""How far a bfloat16 / float16 codec decoder (`model.codec_dtype`) is from float32's PCM, on the
CPU or a GPU: the figures behind the bound in docs/performance.md and tests/codec_bound.py.

    python -m benchmarks.codec_precision                 # the CPU
    python -m benchmarks.codec_precision --device cuda   # the CUDA path (Triton epilogues)

For each weight set (the official-reference fixture's, compared with the official float32
PCM; dummy weights at the tiny and the 1.7B widths, compared with omniflow's float32 CPU
decode) and dtype, it prints max abs error and SNR of the streaming decoder in chunks of 1 and
5 frames, and of the full-sequence decode; then the share of the error that rounding the
weights alone causes (float32 compute on rounded weights).
"""

from __future__ import annotations

import argparse
import copy

import torch

from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.models.qwen3_tts.codec_loader import load_codec
from omniflow.models.qwen3_tts.codec_modules import CodecDecoder
from omniflow.models.qwen3_tts.codec_stream import StreamingDecoder
from tests.codec_bound import DTYPES, pcm_error
from tests.models.test_codec_precision import fixture_decoder
from tests.models.test_codec_stream import codes, decoder


def dummy(preset: str) -> tuple[CodecDecoder, torch.Tensor, torch.Tensor]:
    """The preset's codec with dummy weights (the tests' seeds), 12 codes, float32 CPU PCM."""
    if preset == "qwen3_tts_tiny":
        dec, c = decoder(), codes(12, 5)
    else:
        cfg = build_graph(compose(["platform=cpu", f"model={preset}"])).model
        dec = load_codec(cfg.codec, None, cfg.seed + 1).decoder.eval()
        c = torch.randint(0, 2048, (12, 16), generator=torch.Generator().manual_seed(11))
    with torch.no_grad():
        return dec, c, dec(c[None])[0]


@torch.no_grad()
def rows(name: str, fp32: CodecDecoder, c: torch.Tensor, want: torch.Tensor, dev: torch.device):
    for dtype in DTYPES:
        low = copy.deepcopy(fp32).to(device=dev, dtype=dtype)
        dec = StreamingDecoder(low, 1, dev, dtype)
        for chunk in (1, 5):
            slot = dec.allocate()
            parts = [
                dec.decode([slot], [c[i : i + chunk].to(dev)])[0]
                for i in range(0, c.shape[0], chunk)
            ]
            dec.release(slot)
            show(name, dtype, f"streamed, {chunk}-frame chunks", want, torch.cat(parts))
        show(name, dtype, "full sequence", want, low(c[None].to(dev))[0])
        rounded = copy.deepcopy(fp32).to(dtype).float().to(dev)
        show(name, dtype, "float32 on rounded weights", want, rounded(c[None].to(dev))[0])


def show(name: str, dtype: torch.dtype, path: str, want: torch.Tensor, got: torch.Tensor) -> None:
    err = pcm_error(want, got)
    print(f"| {name} | {str(dtype)[6:]} | {path} | {err.max_abs:.4f} | {err.snr_db:.1f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--real-width", default="qwen3_tts_1_7b", help="'' to skip (slow on a CPU)")
    args = p.parse_args()
    dev = torch.device(args.device)
    print("| weights | dtype | path | max abs | SNR dB |\n| --- | --- | --- | --- | --- |")
    rows("official-reference fixture", *fixture_decoder(), dev)
    rows("dummy, tiny", *dummy("qwen3_tts_tiny"), dev)
    if args.real_width:
        rows(f"dummy, {args.real_width}", *dummy(args.real_width), dev)


if __name__ == "__main__":
    main()
