"""Seeded weights for the reference comparison, drawn by tensor name.

The official implementation and omniflow are compared with the same random weights. Its
config classes initialise codebooks to zero, norms to one and layer scales to a constant,
which would hide a swapped or missing tensor, so every tensor is re-drawn here from a
generator seeded by (seed, tensor name): the fixture script draws the official model's
tensors, the tests draw the same values for the same names, and no weights are committed.
numpy's legacy `RandomState` is used because its streams are frozen across numpy versions;
`fingerprint` lets a test tell "the draw changed" apart from "the model differs".
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import torch


def draw(name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """The fp32 tensor of `shape` for parameter `name`, scaled so activations keep a useful
    size through the stacks (and nothing is the constant an initialiser would leave)."""
    rng = np.random.RandomState((seed * 1_000_003 + zlib.crc32(name.encode())) % 2**32)
    n = math.prod(shape)
    leaf = name.rsplit(".", 1)[-1]
    if name.endswith("norm.weight"):
        values = 1.0 + 0.1 * rng.standard_normal(n)
    elif leaf == "cluster_usage":
        values = rng.uniform(0.5, 1.5, n)
    elif leaf == "bias":
        values = 0.05 * rng.standard_normal(n)
    elif "embedding" in name:  # token tables and codebooks (embedding_sum)
        values = rng.standard_normal(n)
    elif len(shape) >= 2:
        # the codec's upsampling convolutions a little smaller, so its PCM stays inside the
        # [-1, 1] clamp (a clamped output would compare nothing)
        gain = 0.7 if name.startswith("decoder.decoder.") else 1.0
        values = gain * rng.standard_normal(n) / math.sqrt(math.prod(shape[1:]))
    elif leaf == "beta":  # SnakeBeta adds sin^2(x a) / exp(beta): keep that term below 1
        values = 1.0 + 0.1 * rng.standard_normal(n)
    else:  # layer scales, ConvNeXt gamma, SnakeBeta alpha
        values = 0.1 + 0.05 * rng.standard_normal(n)
    return torch.from_numpy(values.astype(np.float32).reshape(shape))


def draw_all(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, torch.Tensor]:
    return {name: draw(name, tuple(shape), seed) for name, shape in shapes.items()}


def fingerprint(tensors: dict[str, torch.Tensor]) -> float:
    """One number that changes when any drawn value changes (position-weighted sum)."""
    total = 0.0
    for name in sorted(tensors):
        flat = tensors[name].double().flatten()
        weights = torch.arange(1, flat.numel() + 1, dtype=torch.float64).remainder(97)
        total += float((flat * weights).sum())
    return total
