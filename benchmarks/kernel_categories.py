"""A profile's GPU kernels summed by what they do: matrix products, attention, norms,
sampling, the decoder's convolutions, elementwise work, copies.

Why: a 1.7B frame launches hundreds of kernels (the code predictor alone ~45 per codebook
step), and the raw table (`talker_baseline --profile`) lists them by name, one row each. The
question before a fusion is where the time goes by kind, and how many launches each kind
costs per step: that is what a fused kernel would remove. Names are matched by patterns
(first match wins, so the convolutions' `implicit_gemm` kernels count as convolutions).
Only device events are summed (`kernel_rows`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from torch.autograd import DeviceType

CATEGORIES: tuple[tuple[str, str], ...] = (
    ("attention", r"paged_decode|frame_attention|_combine_kernel|flash|fmha|attention|sdpa"),
    (
        "convolution",
        r"convolution|conv[_\d]|fprop|dgrad|wgrad|winograd|implicit|cudnn|nchwtonhwc|nhwctonchw",
    ),
    ("matmul", r"skinny|sum_splits|gemm|gemv|cutlass|xmma|nvjet|cublas|matmul|_mm_|splitk"),
    ("norm/rotary", r"rms_norm|norm_rope|layer_norm|rotary|moments"),
    ("sampling", r"sample|topk|sort|softmax|multinomial|argmax|gumbel|cumsum|scan"),
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


class ProfiledEvent(Protocol):
    """What `kernel_rows` reads of torch's `FunctionEventAvg`."""

    key: str
    count: int
    self_device_time_total: float
    device_type: DeviceType
    is_user_annotation: bool


def kernel_rows(events: Iterable[ProfiledEvent]) -> list[KernelRow]:
    """The GPU kernels (and copies) of `prof.key_averages()`. A host op's self device time
    is the time of the kernels it launched, which have rows of their own: counting both
    would count every kernel twice (torch's own table sums device events only, too)."""
    return [
        KernelRow(e.key, e.count, e.self_device_time_total)
        for e in events
        if e.device_type == DeviceType.CUDA and not e.is_user_annotation
    ]


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
