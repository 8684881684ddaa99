"""Token sampling for AR stages: the sampler's per-step state, the draw and the penalties."""
