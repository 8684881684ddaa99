"""Small factories with real objects: the tiny model, a talker engine, speech requests."""

from __future__ import annotations

import copy
import functools
from functools import partial

import torch

from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.config.schema import SchedulerConfig
from omniflow.core.speech import SpeechRequest
from omniflow.engine.stage_engine import StageEngine
from omniflow.models.qwen3_tts.ar_model import SUBTALKER_TOP_K, build_ar_model
from omniflow.models.qwen3_tts.factory import TalkerBundle, build_talker
from omniflow.models.qwen3_tts.processor import TalkerProcessor
from omniflow.models.qwen3_tts.talker import Talker
from omniflow.models.shapes import ModelConfig
from omniflow.sampling.draw import SamplingBatch, draw_fixed_policy
from omniflow.sched.ar import ARScheduler
from omniflow.worker.ar_runner import ARModelRunner


@functools.cache
def tiny_model_config() -> ModelConfig:
    return build_graph(compose(["platform=cpu"])).model


@functools.cache
def tiny_bundle() -> TalkerBundle:
    return build_talker(tiny_model_config(), torch.device("cpu"))


def tiny_decoder(slots: int):
    """A streaming codec decoder of the tiny preset (fp32 on the CPU, as the pipeline has it)."""
    from omniflow.models.qwen3_tts.codec_loader import load_codec
    from omniflow.models.qwen3_tts.codec_stream import StreamingDecoder

    model = tiny_model_config()
    weights = load_codec(model.codec, None, model.seed + 1).eval()
    return StreamingDecoder(weights.decoder, slots, torch.device("cpu"), torch.float32)


def biased_codec_decoder():
    """The tiny preset's codec decoder (`CodecDecoder`, fp32, CPU) with its biases and
    SnakeBeta parameters drawn away from their dummy zeros: a comparison of two decoder paths
    then sees every bias and activation (the dummy init zeroes them)."""
    from omniflow.models.qwen3_tts.codec_modules import SpeechTokenizerWeights, init_dummy_codec

    w = SpeechTokenizerWeights(tiny_model_config().codec)
    init_dummy_codec(w, 3)
    with torch.no_grad():
        g = torch.Generator().manual_seed(4)
        for name, p in w.named_parameters():
            if name.endswith(("bias", "alpha", "beta")):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return w.decoder.eval()


def talker_engine(
    *,
    async_scheduling: bool = False,
    max_num_seqs: int = 8,
    max_resident_seqs: int | None = None,
    max_num_batched_tokens: int = 256,
    max_model_len: int = 512,
    block_size: int = 4,
    num_kv_blocks: int = 512,
    window_k: int = 0,
    frame_graphs: bool = False,
    decode_graphs: bool = False,
    stream_decode: bool = False,
    prompt_graph_tokens: int = 0,
    audio_chunk_frames: int = 0,
    audio_pass_steps: int = 0,
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    bundle: TalkerBundle | None = None,
) -> tuple[StageEngine, TalkerProcessor]:
    """A talker engine over the tiny model: on the CPU in fp32 by default; with `device` (a GPU
    test) the model is built there in `dtype`; `bundle`: another CPU model (`eos_bundle`)."""
    cfg = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_resident_seqs=max_resident_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        block_size=block_size,
        num_kv_blocks=num_kv_blocks,
        async_scheduling=async_scheduling,
    )
    if device is None or device.type == "cpu":
        device, bundle = torch.device("cpu"), bundle or tiny_bundle()
    else:
        name = str(dtype).removeprefix("torch.")
        bundle = build_talker(tiny_model_config().model_copy(update={"dtype": name}), device)
    frame_sample = partial(draw_fixed_policy, top_k=SUBTALKER_TOP_K) if frame_graphs else None
    decoder = tiny_decoder(max_resident_seqs or max_num_seqs) if stream_decode else None
    model = build_ar_model(
        bundle,
        decoder,
        frame_sample,
        max_batch=max_num_seqs,
        decode_graphs=decode_graphs,
        window_k=window_k,
        prompt_graph_tokens=prompt_graph_tokens,
        audio_chunk_frames=audio_chunk_frames,
        audio_pass_steps=audio_pass_steps,
    )
    runner = ARModelRunner(
        model,
        cfg,
        device,
        dtype,
        audio_chunk_frames=audio_chunk_frames,
        audio_pass_steps=audio_pass_steps,
    )
    engine = StageEngine(
        "talker",
        ARScheduler(cfg, window_k=window_k, audio_pass_steps=audio_pass_steps),
        runner,
        async_scheduling=async_scheduling,
    )
    return engine, TalkerProcessor(bundle.tokenizer, bundle.vocab, max_model_len)


def graphed_gpu_engine(**kw) -> tuple[StageEngine, TalkerProcessor]:
    """A talker engine as it is served on a GPU: bf16, the decode and frame graphs on."""
    return talker_engine(
        device=torch.device("cuda"),
        dtype=torch.bfloat16,
        decode_graphs=True,
        frame_graphs=True,
        block_size=16,
        num_kv_blocks=128,
        **kw,
    )


def speech(rid: str, text: str = "Hello there.", **kw) -> SpeechRequest:
    kw.setdefault("seed", 1)
    kw.setdefault("voice", "vivian")
    return SpeechRequest(request_id=rid, text=text, **kw)


def build(
    pipeline: str = "qwen3_tts",
    *overrides: str,
    bundle: TalkerBundle | None = None,
    start: bool = True,
):
    """A running orchestrator (threads started) for `pipeline` on the CPU. `start=False`:
    not started yet, so requests submitted before `orch.start()` share the first step."""
    from omniflow.build.pipeline import build_pipeline

    platform = [] if any(o.startswith("platform=") for o in overrides) else ["platform=cpu"]
    # in this process (the tests reach its engines), also where CUDA's default is a process
    runtime = ["pipeline.runtime=in_process"]
    graph = build_graph(compose([f"pipeline={pipeline}", *platform, *runtime, *overrides]))
    orch = build_pipeline(graph, bundle)
    if start:
        orch.start()
    return orch


class Collector:
    """A sink that records events and signals the terminal one (tests wait on it)."""

    def __init__(self) -> None:
        import threading

        self.events = []
        self.done = threading.Event()

    def __call__(self, event) -> None:
        self.events.append(event)
        if event.finished:
            self.done.set()

    def wait(self, timeout: float = 60.0):
        assert self.done.wait(timeout), "request did not finish"
        return self

    @property
    def pcm(self):
        import numpy as np

        parts = [e.pcm for e in self.events if e.pcm is not None]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)

    @property
    def terminal(self):
        ends = [e for e in self.events if e.finished]
        assert len(ends) == 1, f"expected exactly one terminal event, got {len(ends)}"
        return ends[0]


class FirstAudio(Collector):
    """A collector that also signals its first PCM (its request is then decoding)."""

    def __init__(self) -> None:
        import threading

        super().__init__()
        self.started = threading.Event()

    def __call__(self, event) -> None:
        super().__call__(event)
        if event.pcm is not None:
            self.started.set()


EOS = 2150


def biased_bundle(bias: torch.Tensor) -> TalkerBundle:
    """The tiny model with `bias` [vocab] added to its codebook-0 head's logits."""
    base = tiny_bundle()
    weights = copy.deepcopy(base.talker.weights)
    head = weights.talker.codec_head
    biased = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    with torch.no_grad():
        biased.weight.copy_(head.weight)
        biased.bias.copy_(bias)
    weights.talker.codec_head = biased
    return TalkerBundle(Talker(weights, base.talker.config, base.vocab), base.tokenizer, base.vocab)


def eos_bundle() -> TalkerBundle:
    """The tiny model with a codebook-0 head biased so that EOS always wins the draw."""
    bias = torch.zeros(tiny_bundle().talker.shape.vocab_size)
    bias[EOS] = 1e4
    return biased_bundle(bias)


def wait_idle(orch, timeout: float = 20.0) -> None:
    """Every request ended and every engine applied its drops (KV blocks, runner state and
    decoder slots back), read through the public `stats()`. The engines are woken with
    `Wake` messages; nothing sleeps as synchronisation beyond this bounded poll."""
    import time

    from omniflow.engine.messages import Wake

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for e in orch.engines:
            e.send(Wake())
        stats = orch.stats()
        held = any(
            s.running or s.waiting or s.kv_blocks_used or s.decoder_slots_used for s in stats.stages
        )
        if not stats.in_flight and not held and not any(e.has_work for e in orch.engines):
            return
        time.sleep(0.01)
    raise AssertionError("pipeline did not go idle")


def stage_stats(orch, name: str):
    """The public gauges of one stage."""
    return next(s for s in orch.stats().stages if s.name == name)


def sampling_batch(b: int, g: torch.Generator, **kw) -> SamplingBatch:
    """A random codebook-0 `SamplingBatch` of b rows over 512 ids: greedy rows mixed in,
    per-row top_k (<= 0: all ids), penalties, bans and seen masks; `kw` replaces fields."""
    temperature = torch.rand(b, generator=g) + 0.5
    temperature[::4] = 0.0
    base = dict(
        temperature=temperature,
        top_k=torch.randint(-1, 80, (b,), generator=g),
        top_p=torch.ones(b),
        repetition_penalty=1.0 + torch.rand(b, generator=g),
        seeds=torch.randint(-(2**62), 2**62, (b,), generator=g),
        counters=torch.randint(0, 2**20, (b,), generator=g),
        banned=torch.rand(b, 512, generator=g) < 0.1,
        seen=torch.rand(b, 512, generator=g) < 0.3,
    )
    base.update(kw)
    return SamplingBatch(**base)


def intercept_audio(model, through) -> None:
    """Both decoder calls of a fused talker's model, `queue_audio` (after the read-back) and
    `queue_audio_ahead` (before it), go through `through(request_ids, call)`: `call()`
    queues the real one. For faults injected into, and spies on, a step's audio."""
    queue, ahead = model.queue_audio, model.queue_audio_ahead

    def after(steps):
        return through({r for s in steps for r in s.request_ids}, lambda: queue(steps))

    def before(request_ids, queued):
        return through(set(request_ids), lambda: ahead(request_ids, queued))

    model.queue_audio, model.queue_audio_ahead = after, before
