"""The pydantic schema of a composed omniflow config.

Every model is frozen and forbids unknown keys, so a typo anywhere fails with its full key
path. Stages are a mapping keyed by name (Hydra replaces lists wholesale, so an overlay
touching one list item would drop the others) and a discriminated union on `kind`.
Cross-field rules (what depends on the model, the platform or other stages) live in
`resolve.py` and its rule modules (`decode_rules.py`, `stage_rules.py`), not here: this file
only states the shape and the per-field bounds.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from omniflow.config.commands import BenchConfig, SynthConfig
from omniflow.config.deploy_schema import DeployConfig
from omniflow.config.server import ServerConfig
from omniflow.core.frozen import Dtype, Frozen
from omniflow.models.shapes import ModelConfig

# --------------------------------------------------------------------------- pipeline


class StepLimits(Frozen):
    """What every stage scheduler bounds: requests and tokens per step, and whether the next
    step is planned while the current one executes. A generation stage (code2wav) has only
    these: it keeps no KV cache, so KV keys there would be accepted and ignored."""

    max_num_seqs: int = Field(32, ge=1, description="Most requests running in one step.")
    max_num_batched_tokens: int = Field(
        2048, ge=1, description="Token budget of one step (prefill chunks + decode tokens)."
    )
    async_scheduling: bool = Field(
        False, description="Plan step n+1 while step n executes (in-flight tokens as placeholders)."
    )


class SchedulerConfig(StepLimits):
    """An AR stage's scheduler: step limits plus the paged KV cache (docs/architecture.md)."""

    max_model_len: int = Field(
        4096, ge=1, description="Longest sequence (prompt + generated) a request may reach."
    )
    block_size: int = Field(16, ge=1, description="Tokens per KV-cache block.")
    num_kv_blocks: int = Field(2048, ge=1, description="KV-cache blocks in the stage's pool.")
    max_resident_seqs: int | None = Field(
        None,
        ge=1,
        description="Most requests the stage holds at once (KV, decoder state). Above "
        "max_num_seqs, streams take turns for the max_num_seqs rows of a step by earliest "
        "playback deadline: one far ahead of its playback sits out a step so a new arrival "
        "or a stream near its deadline is seated (needs playback_margin_ms and windows); "
        "requests beyond what the measured step time keeps playing wait. null: max_num_seqs.",
    )
    arrival_hold_ms: float = Field(
        0,
        ge=0,
        le=1000,
        description="While streams run, a new request waits up to this long to be seated, so "
        "that arrivals are prefilled together in one step and the running streams' windows "
        "are not cut for each (throughput at many seats, paid in first audio; needs windows "
        "and the playback clock); 0: seated at the next step.",
    )
    arrival_hold_min_running: int = Field(
        1,
        ge=1,
        description="arrival_hold_ms holds arrivals only while at least this many streams "
        "take steps: near a full batch, where an admitting step stalls the most rows and "
        "capacity is what limits; below it an arrival is seated at the next step (first "
        "audio first). 1: whenever streams run.",
    )


class UpstreamConfig(Frozen):
    """The edge feeding a chunk-receiving stage: where chunks come from and how big they are."""

    stage: str = Field(description="Name of the stage whose outputs this stage receives.")
    chunk_frames: int = Field(25, ge=1, description="Frames per chunk after the first.")
    initial_chunk_frames: int = Field(
        1, ge=1, description="Frames in the first chunk (small, so first audio comes early)."
    )
    receive_timeout_s: float = Field(
        60.0, gt=0, description="Deadline for the next chunk; an upstream stall past it fails."
    )


class StageBase(Frozen):
    """Fields shared by every stage kind; the rules on them are applied by resolve.py."""

    arch: str = Field(description="Registry name of the stage's model component.")
    upstream: UpstreamConfig | None = Field(
        None, description="Set on a stage that receives chunks from another stage."
    )
    window_k: int | None = Field(
        0,
        description="Multi-step decode window: 0 off, 2..16 steps merged per round; null: 8 on "
        "an AR stage that can take windows where CUDA graphs are captured, else 0.",
    )
    stream_decode: bool = Field(
        False, description="The stage owns a streaming codec decoder and emits PCM."
    )
    ref_context_frames: int | None = Field(
        None,
        ge=0,
        description="Reference frames priming the decoder; unset means its attention window.",
    )
    tensor_parallel_size: int = Field(1, ge=1, description="Tensor-parallel degree.")
    pipeline_parallel_size: int = Field(1, ge=1, description="Pipeline-parallel degree.")
    enable_prefix_caching: bool = Field(False, description="Reuse KV of shared prompt prefixes.")
    speculative_tokens: int = Field(0, ge=0, description="Speculative draft tokens per step.")


class ARStageConfig(StageBase):
    """An autoregressive stage (the talker): paged KV, continuous batching."""

    kind: Literal["ar"] = Field(description="Stage kind discriminator.")
    scheduler: SchedulerConfig = Field(
        default_factory=SchedulerConfig, description="Scheduler limits and KV cache."
    )
    prompt_graph_tokens: int | None = Field(
        None,
        ge=0,
        le=2048,
        description="Prefills of whole prompts replay a CUDA graph per token bucket up to this "
        "many tokens (with platform.cuda_graphs; eagerly elsewhere); a larger step runs as "
        "several replays of whole requests, a single longer prompt eagerly; 0: eager prefill; "
        "null: 512 (capped at scheduler.max_num_batched_tokens) with CUDA graphs, else 0.",
    )
    audio_chunk_frames: int | None = Field(
        None,
        ge=0,
        le=16,
        description="With window_k and stream_decode: decode a window's audio in passes of this "
        "many frames (a divisor of window_k, from 2 to window_k) as their steps are read back, "
        "on a second CUDA stream beside the window's remaining steps (window_k itself: one pass "
        "at the window's end, on that stream, beside the next step); under async scheduling "
        "each pass's audio is sent as soon as it is decoded; 0: one pass at the window's end "
        "on the main stream; null: window_k on CUDA with graphs, else 0.",
    )
    audio_pass_steps: int = Field(
        0,
        ge=0,
        le=16,
        description="With stream_decode: outside windows, streams that were playing when a "
        "run of single steps began hold their frames for up to this many steps (as their "
        "playback slack allows) and decode them in one decoder pass, which costs nearly as "
        "much for one frame as for several; new streams still hear their first frames at "
        "once. No window opens while frames are held. 0: every step's frames decoded at once.",
    )
    playback_margin_ms: int | None = Field(
        40,
        ge=0,
        le=2000,
        description="The playback clock's margin: each stream's next frame is due by its "
        "first frame's time + the audio made - this margin. With window_k a window runs only "
        "as many steps, at the measured step time, as the tightest scheduled stream can wait "
        "(window_k is the cap); with or without windows, on a stage that decodes its own "
        "audio, streams with audio in hand sit out an arrival's step and admission control "
        "refuses a stream the measured step time could not keep playing. null: no clock "
        "(windows run window_k steps whenever the gates allow).",
    )


class GenerationStageConfig(StageBase):
    """A non-autoregressive stage (code2wav): one step per received chunk."""

    kind: Literal["generation"] = Field(description="Stage kind discriminator.")
    scheduler: StepLimits = Field(default_factory=StepLimits, description="Scheduler limits.")


StageConfig = Annotated[ARStageConfig | GenerationStageConfig, Field(discriminator="kind")]
STAGE_KINDS = ("ar", "generation")


class PipelineConfig(Frozen):
    """A stage graph: stages keyed by name, edges given by each stage's `upstream`."""

    name: str = Field(description="Pipeline name (shown in logs and /v1/models).")
    runtime: Literal["in_process", "process", "ray"] | None = Field(
        None,
        description="Where stage engines run: threads of this process; all of them in one "
        "process of their own beside the server's (its own interpreter lock; "
        "docs/architecture.md); or each stage in its own Ray actor on its own device "
        "(two-stage pipelines; docs/deploy.md). null: process on CUDA (serve, bench), else "
        "in_process (other platforms, deploy=ray, synth, bench.phase_timing=device).",
    )
    stages: dict[str, StageConfig] = Field(min_length=1, description="Stages keyed by name.")


# --------------------------------------------------------------------------- platform


class PlatformConfig(Frozen):
    """Which device the stages run on."""

    name: Literal["auto", "cpu", "cuda", "npu"] = Field(description="Platform name.")
    dtype: Dtype | None = Field(None, description="Default dtype; unset: the platform's own.")
    codec_dtype: Dtype | None = Field(
        None,
        description="The streaming codec decoder's dtype where `model.codec_dtype` is unset; "
        "unset: the platform's own (float16 on CUDA, float32 elsewhere).",
    )
    cuda_graphs: bool = Field(False, description="Capture CUDA graphs for bucketed batch sizes.")
    gpu_memory_utilization: float | None = Field(
        None,
        gt=0,
        le=1,
        description="CUDA: fraction of the GPU memory to use; each AR stage's KV pool takes "
        "what is left of it after weights and graphs (its num_kv_blocks is then a cap).",
    )
    device_index: int = Field(
        0,
        ge=0,
        description="Accelerator index (npu); 0 elsewhere: on CUDA choose the GPU with "
        "CUDA_VISIBLE_DEVICES.",
    )
    cudnn_benchmark: bool | None = Field(
        None,
        description="CUDA: cuDNN times its algorithms per convolution shape and keeps the "
        "fastest (the codec decoder's); the chosen algorithm, hence PCM within TF32 rounding, "
        "may differ between runs. null: on unless a stage decodes chunks of varying length "
        "(two-stage code2wav), where every new shape would be timed again.",
    )


class OmniflowSpec(Frozen):
    """The whole validated configuration."""

    pipeline: PipelineConfig = Field(description="The stage graph.")
    model: ModelConfig = Field(description="The model preset.")
    platform: PlatformConfig = Field(description="The platform.")
    server: ServerConfig = Field(default_factory=ServerConfig, description="Server settings.")
    synth: SynthConfig = Field(default_factory=SynthConfig, description="Synth settings.")
    bench: BenchConfig = Field(default_factory=BenchConfig, description="Bench settings.")
    deploy: DeployConfig = Field(
        default_factory=DeployConfig, description="Where serve runs the pipeline (local, ray)."
    )
