"""A profile's GPU kernels summed by what they do: matrix products, attention, norms,
sampling, the decoder's convolutions, elementwise work, copies.

Why: a 1.7B frame launches hundreds of kernels (the code predictor alone ~45 per codebook
step), and the raw table (`talker_baseline --profile`) lists them by name, one row each. The
question before a fusion is where the time goes by kind, and how many launches each kind
costs per step: that is what a fused kernel would remove. Names are matched by patterns
(first match wins, so the convolutions' `implicit_gemm` kernels count as convolutions).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

CATEGORIES: tuple[tuple[str, str], ...] = (
    ("convolution", r"conv|fprop|dgrad|wgrad|winograd|implicit|cudnn"),
    ("attention", r"paged_decode|frame_attention|flash|fmha|attention|sdpa"),
    ("matmul", r"skinny|gemm|gemv|cutlass|xmma|nvjet|cublas|matmul|_mm_"),
    ("norm/rotary", r"rms_norm|norm_rope|layer_norm|rotary"),
    ("sampling", r"sample|topk|sort|softmax|multinomial|argmax|gumbel|cumsum"),
    ("elementwise", r"elementwise|vectorized|unrolled|snake|silu|reduce|where|fill"),
    ("copy", r"memcpy|memset|copy|cat|index|gather|scatter|stack"),
)


def categorize(name: str) -> str:
    """The category of a kernel name ("other" when no pattern matches)."""
    lower = name.lower()
    for category, pattern in CATEGORIES:
        if re.search(pattern, lower):
            return category
    return "other"


@dataclass(frozen=True)
class KernelRow:
    """One kernel name of a profile: how often it ran and its total device time."""

    name: str
    count: int
    device_us: float


def category_table(rows: Iterable[KernelRow], steps: int) -> str:
    """A markdown table: per category, launches and device time per step, and its share of
    the kernels' total time (categories by time, largest first)."""
    launches: dict[str, int] = {}
    time_us: dict[str, float] = {}
    for row in rows:
        if row.device_us <= 0:
            continue
        cat = categorize(row.name)
        launches[cat] = launches.get(cat, 0) + row.count
        time_us[cat] = time_us.get(cat, 0.0) + row.device_us
    total = sum(time_us.values())
    per = max(steps, 1)
    lines = [
        f"kernels by category, per step ({steps} steps, {total / per / 1e3:.2f} ms of kernel time)",
        "",
        "| category | launches per step | ms per step | share |",
        "| --- | --- | --- | --- |",
    ]
    for cat in sorted(time_us, key=time_us.__getitem__, reverse=True):
        share = time_us[cat] / total if total else 0.0
        lines.append(
            f"| {cat} | {launches[cat] / per:.1f} | {time_us[cat] / per / 1e3:.3f} | {share:.1%} |"
        )
    return "\n".join(lines) + "\n"
