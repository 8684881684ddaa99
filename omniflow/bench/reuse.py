"""One built pipeline kept across the jobs of a sweep (`bench.reuse_pipeline`).

Hydra runs a sweep's jobs one after another in one process. Building a pipeline (weights,
Triton compiles, CUDA graphs) is most of a GPU job, longer than its measurement (measured:
docs/performance.md, "Build time"). Jobs whose stage graphs are equal (they differ only in
`bench.*` keys, e.g. a sweep over concurrency) can share one: the cache keeps the last job's
pipeline, started, and hands it to the next job when its graph is the same; a different graph
stops it and builds anew. A long-lived server serves many requests on one pipeline too, so a
reused pipeline is measured as a real server would be; each result says whether it was reused.
"""

from __future__ import annotations

import atexit
import gc
import logging
import time
from collections.abc import Callable

import torch

from omniflow.build.pipeline import build_pipeline
from omniflow.config.graph import StageGraph
from omniflow.core.pipeline import Pipeline

log = logging.getLogger(__name__)


class PipelineCache:
    """The last job's started pipeline and the graph it was built from."""

    def __init__(self, build: Callable[[StageGraph], Pipeline] = build_pipeline) -> None:
        self.build = build
        self._key: str | None = None
        self._device = "cpu"
        self._pipeline: Pipeline | None = None

    def get(self, graph: StageGraph) -> tuple[Pipeline, bool]:
        """A started pipeline for `graph`, and whether it was reused (else built now)."""
        key = repr(graph)  # every field of the graph: equal graphs build equal pipelines
        if self._pipeline is not None and key == self._key:
            if self._pipeline.stats().healthy:
                log.info("reusing the pipeline the previous job built (bench.reuse_pipeline)")
                return self._pipeline, True
            log.warning("the kept pipeline has a dead stage: building a new one")
        self.close()
        start = time.perf_counter()
        pipeline = self.build(graph)
        pipeline.start()
        log.info("pipeline built in %.1f s", time.perf_counter() - start)
        self._key, self._pipeline, self._device = key, pipeline, graph.platform.device
        return pipeline, False

    @property
    def kept(self) -> bool:
        """Whether a pipeline is kept (started) for the next job."""
        return self._pipeline is not None

    def close(self) -> None:
        """Stop the kept pipeline and give its device memory back before another is built."""
        if self._pipeline is None:
            return
        pipeline, self._key, self._pipeline = self._pipeline, None, None
        pipeline.stop()
        device = self._device
        del pipeline
        gc.collect()  # CUDA graphs and KV pools go with their last reference
        if device.startswith("cuda"):
            torch.cuda.empty_cache()


CACHE = PipelineCache()
atexit.register(CACHE.close)
