"""The pydantic schema of a composed omniflow config.

Every model is frozen and forbids unknown keys, so a typo anywhere fails with its full key
path. Stages are a mapping keyed by name (Hydra replaces lists wholesale, so an overlay
touching one list item would drop the others) and a discriminated union on `kind`.
Cross-field rules (what depends on the model, the platform or other stages) live in
`resolve.py`, not here: this file only states the shape and the per-field bounds.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

Dtype = Literal["float32", "bfloat16", "float16"]


class Frozen(BaseModel):
    """Base for every config model: immutable, unknown keys refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")


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
    """Fields shared by every stage kind; the rules on them are in resolve.py."""

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
        ge=1,
        le=16,
        description="With window_k and stream_decode: decode a window's audio in passes of this "
        "many frames (a divisor of window_k, from 2 to window_k) as their steps are read back, "
        "on a second CUDA stream beside the window's remaining steps (window_k itself: one pass "
        "at the window's end, on that stream, beside the next window's steps); null: one pass "
        "at the window's end on the main stream.",
    )
    window_admits: bool = Field(
        False,
        description="With window_k: a window may open on a step that admits new requests "
        "beside running ones (each new prompt prefilled whole in the window's first step, "
        "then decoded with the rest), instead of a single mixed step; the arrivals' first "
        "audio then comes at the window's end, and requests queued for a seat "
        "(max_num_seqs) no longer close windows. false: a step that admits is a single "
        "step, and any waiting request refuses a window.",
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
    runtime: Literal["in_process", "process_per_stage"] = Field(
        "in_process", description="Where stage engines run: threads of one process, or processes."
    )
    stages: dict[str, StageConfig] = Field(min_length=1, description="Stages keyed by name.")


# --------------------------------------------------------------------------- model


class TransformerShape(Frozen):
    """A Qwen3 decoder stack's shape."""

    num_layers: int = Field(ge=1, description="Decoder layers.")
    hidden_size: int = Field(ge=1, description="Residual width.")
    num_heads: int = Field(ge=1, description="Query heads.")
    num_kv_heads: int = Field(ge=1, description="Key/value heads (GQA).")
    head_dim: int = Field(ge=2, description="Width of one head.")
    intermediate_size: int = Field(ge=1, description="SwiGLU inner width.")
    rms_norm_eps: float = Field(1e-6, gt=0, description="RMSNorm epsilon.")
    rope_theta: float = Field(1e6, gt=0, description="RoPE base.")


class TalkerShape(TransformerShape):
    """The talker: codec-token LM over summed text + codec embeddings."""

    vocab_size: int = Field(3072, ge=1, description="Codec vocabulary (acoustic + special ids).")
    text_vocab_size: int = Field(ge=1, description="Text vocabulary.")
    text_hidden_size: int = Field(ge=1, description="Text embedding width before projection.")


class CodePredictorShape(TransformerShape):
    """The code predictor: codebooks 1..15 of each frame from the talker's hidden state."""

    num_code_groups: int = Field(16, ge=2, description="Codebooks per frame.")
    codebook_size: int = Field(2048, ge=2, description="Entries per acoustic codebook.")


class CodecShape(Frozen):
    """The 12.5 Hz codec decoder (codes -> 24 kHz PCM)."""

    num_quantizers: int = Field(16, ge=1, description="RVQ codebooks.")
    codebook_size: int = Field(2048, ge=2, description="Entries per codebook.")
    codebook_dim: int = Field(
        256, ge=1, description="Width of one codebook entry (the projections output twice it)."
    )
    latent_dim: int = Field(1024, ge=1, description="Width after the pre-conv.")
    hidden_size: int = Field(512, ge=1, description="Transformer width.")
    num_layers: int = Field(8, ge=1, description="Transformer layers.")
    num_heads: int = Field(16, ge=1, description="Transformer heads.")
    head_dim: int = Field(64, ge=2, description="Transformer head width.")
    num_kv_heads: int | None = Field(None, ge=1, description="KV heads; unset: num_heads.")
    intermediate_size: int = Field(1024, ge=1, description="Transformer MLP width.")
    rms_norm_eps: float = Field(1e-5, gt=0, description="Transformer RMSNorm epsilon.")
    layer_scale: float = Field(0.01, description="Initial layer scale (dummy weights).")
    sliding_window: int = Field(72, ge=1, description="Attention window in frames.")
    rope_theta: float = Field(1e4, gt=0, description="RoPE base.")
    upsampling_ratios: tuple[int, ...] = Field((2, 2), description="Upsample+ConvNeXt factors.")
    upsample_rates: tuple[int, ...] = Field((8, 5, 4, 3), description="Conv decoder factors.")
    decoder_dim: int = Field(1536, ge=1, description="Conv decoder input width.")
    sample_rate: int = Field(24000, ge=1, description="Output sample rate.")


class CodecEncoderConfig(Frozen):
    """The speech tokenizer's encoder (24 kHz audio -> 16-codebook 12.5 Hz codes; a Mimi
    encoder), as `encoder_config` in speech_tokenizer/config.json spells it. Base models."""

    num_filters: int = Field(64, ge=1, description="First SEANet convolution's channels.")
    kernel_size: int = Field(7, ge=1, description="First convolution's kernel.")
    last_kernel_size: int = Field(3, ge=1, description="Last convolution's kernel.")
    residual_kernel_size: int = Field(3, ge=1, description="Residual blocks' kernel.")
    dilation_growth_rate: int = Field(2, ge=1, description="Dilation growth per residual layer.")
    num_residual_layers: int = Field(1, ge=1, description="Residual layers per SEANet stage.")
    compress: int = Field(2, ge=1, description="Residual blocks' channel compression.")
    upsampling_ratios: tuple[int, ...] = Field(
        (8, 6, 5, 4), description="SEANet strides (applied in reverse: 24 kHz -> 25 Hz)."
    )
    hidden_size: int = Field(512, ge=1, description="Transformer width.")
    num_hidden_layers: int = Field(8, ge=1, description="Transformer layers.")
    num_attention_heads: int = Field(8, ge=1, description="Transformer heads.")
    num_key_value_heads: int = Field(8, ge=1, description="Transformer KV heads.")
    head_dim: int = Field(64, ge=2, description="Transformer head width.")
    intermediate_size: int = Field(2048, ge=1, description="Transformer MLP width.")
    norm_eps: float = Field(1e-5, gt=0, description="Transformer LayerNorm epsilon.")
    rope_theta: float = Field(1e4, gt=0, description="Transformer RoPE base.")
    codebook_size: int = Field(2048, ge=2, description="Entries per codebook.")
    codebook_dim: int = Field(256, ge=1, description="Codebook entry width.")
    vector_quantization_hidden_dimension: int = Field(
        256, ge=1, description="Quantizer input width."
    )
    num_quantizers: int = Field(32, ge=1, description="Quantizer codebooks in the checkpoint.")
    num_semantic_quantizers: int = Field(1, ge=1, description="Semantic (first) codebooks.")
    frame_rate: float = Field(12.5, gt=0, description="Code frames per second.")
    sampling_rate: int = Field(24000, ge=1, description="Input sample rate.")
    valid_quantizers: int = Field(
        16, ge=1, description="Codes kept per frame (`encoder_valid_num_quantizers`)."
    )


class SpeakerEncoderConfig(Frozen):
    """The ECAPA-TDNN speaker encoder (128-bin log-mel -> speaker embedding), as
    `speaker_encoder_config` in a Base checkpoint's config.json spells it."""

    mel_dim: int = Field(128, ge=1, description="Log-mel bins.")
    enc_dim: int = Field(1024, ge=1, description="Embedding width (the talker's hidden size).")
    enc_channels: tuple[int, ...] = Field(
        (512, 512, 512, 512, 1536), description="Channels per TDNN layer."
    )
    enc_kernel_sizes: tuple[int, ...] = Field((5, 3, 3, 3, 1), description="Kernels per layer.")
    enc_dilations: tuple[int, ...] = Field((1, 2, 3, 4, 1), description="Dilations per layer.")
    enc_attention_channels: int = Field(128, ge=1, description="Attentive pooling width.")
    enc_res2net_scale: int = Field(8, ge=1, description="Res2Net scale.")
    enc_se_channels: int = Field(128, ge=1, description="Squeeze-excitation width.")
    sample_rate: int = Field(24000, ge=1, description="Input sample rate.")


class ModelConfig(Frozen):
    """A model preset: family, shapes and where the weights come from."""

    family: Literal["qwen3_tts"] = Field(description="Model family (selects the registry).")
    name: str = Field(description="Served model name.")
    load: Literal["auto", "dummy", "checkpoint"] = Field(
        "auto", description="auto: checkpoint when `path` is set, else dummy weights."
    )
    path: str | None = Field(None, description="Checkpoint directory (published layout).")
    seed: int = Field(0, description="Seed of the deterministic dummy initialisation.")
    dtype: Dtype | None = Field(None, description="Weights/activations dtype; unset: platform's.")
    codec_dtype: Dtype = Field(
        "float32",
        description="The streaming codec decoder's dtype (float32: exact PCM; bfloat16: a "
        "faster decoder at large batches on a GPU, PCM within bf16 rounding; "
        "docs/benchmarks.md).",
    )
    tokenizer: Literal["auto", "byte", "bpe"] = Field(
        "auto", description="auto: the checkpoint's BPE with a path, else byte-level."
    )
    supports_instructions: bool = Field(
        True, description="Style instructions are part of the prompt (the 0.6B model has none)."
    )
    talker: TalkerShape = Field(description="Talker shape.")
    code_predictor: CodePredictorShape = Field(description="Code predictor shape.")
    codec: CodecShape = Field(description="Codec decoder shape.")
    codec_encoder: CodecEncoderConfig | None = Field(
        None, description="Base models (voice clone): the codec encoder's shape; unset: none."
    )
    speaker_encoder: SpeakerEncoderConfig | None = Field(
        None,
        description="Base models (voice clone): the speaker encoder's shape; unset: a "
        "CustomVoice model, which refuses voice-clone requests.",
    )


# --------------------------------------------------------------------------- platform


class PlatformConfig(Frozen):
    """Which device the stages run on."""

    name: Literal["auto", "cpu", "cuda", "npu"] = Field(description="Platform name.")
    dtype: Dtype | None = Field(None, description="Default dtype; unset: the platform's own.")
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


# --------------------------------------------------------------------------- commands


class ServerConfig(Frozen):
    """`omniflow serve` settings."""

    host: str = Field("127.0.0.1", description="Bind address.")
    port: int = Field(8000, ge=0, le=65535, description="Bind port (0: any free port).")
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Log level of omniflow's loggers (and uvicorn's)."
    )
    max_input_chars: int = Field(4096, ge=1, description="Longest accepted `input` text.")
    max_concurrent_requests: int = Field(256, ge=1, description="Requests admitted at once.")
    max_buffered_audio_s: float = Field(
        10.0,
        gt=0,
        allow_inf_nan=False,
        description="Audio a request may get ahead of its client (seconds); with that much "
        "unread, the request is paused (keeping its state) until the client reads. The same "
        "amount bounds each request's frame backlog between stages.",
    )
    stalled_client_timeout_s: float = Field(
        60.0,
        gt=0,
        allow_inf_nan=False,
        description="A streamed response whose client takes nothing for this long is "
        "aborted, releasing its KV blocks and decoder slot.",
    )
    keep_alive_timeout_s: float = Field(
        75.0,
        gt=0,
        allow_inf_nan=False,
        description="How long an idle kept-alive connection stays open. Longer than the "
        "clients' own pool expiry (httpx: 5 s), so that the client, not the server, closes an "
        "idle connection: a server that closes one just as the client reuses it fails that "
        "request before its headers (uvicorn's default is 5 s).",
    )
    max_ref_audio_s: float = Field(
        30.0,
        gt=0,
        allow_inf_nan=False,
        description="Longest voice-clone reference (`ref_audio`, seconds); longer is a 400. "
        "The reference is encoded whole on the CPU, once per request.",
    )
    max_ref_audio_bytes: int = Field(
        16 * 1024 * 1024,
        ge=1,
        description="Largest voice-clone reference file (`ref_audio`, decoded bytes); larger "
        "is a 400 before it is decoded.",
    )
    max_voices: int = Field(
        64,
        ge=0,
        description="Voices a Base model's registry (POST /v1/audio/voices) holds; a "
        "registration past it is a 409 until one is deleted (0: none are kept).",
    )


class SynthConfig(Frozen):
    """`omniflow synth` settings (one offline request)."""

    text: str = Field("Hello there.", description="Text to speak.")
    out: str = Field(
        "out.wav", description="Output file; its extension picks the format (wav, flac, mp3, ...)."
    )
    voice: str | None = Field(
        None, description="Speaker; unset: vivian, or none with ref_audio (a voice clone)."
    )
    language: str = Field("auto", description="Language, or auto.")
    instructions: str | None = Field(None, description="Style instruction.")
    ref_audio: str | None = Field(
        None, description="Voice clone (a Base model): the reference recording's file."
    )
    ref_text: str | None = Field(
        None, description="Voice clone: the reference's transcript (in-context cloning)."
    )
    x_vector_only_mode: bool = Field(
        False, description="Voice clone from the speaker embedding alone (no ref_text)."
    )
    seed: int | None = Field(None, description="Sampling seed.")
    max_new_tokens: int | None = Field(None, ge=1, description="Most frames to generate.")
    ignore_eos: bool = Field(False, description="Generate exactly max_new_tokens frames.")


class BenchConfig(Frozen):
    """`omniflow bench` settings (one job of a sweep)."""

    prompts: str | None = Field(None, description="JSONL prompt file; unset: the shipped set.")
    num_prompts: int = Field(16, ge=1, description="Prompts per round (see prompts_per_lane).")
    concurrency: int = Field(1, ge=1, description="Requests in flight.")
    prompts_per_lane: int | None = Field(
        None,
        ge=1,
        description="When set, a round sends at least this many prompts per request in flight "
        "(max(num_prompts, prompts_per_lane * concurrency)): one sweep over concurrency keeps "
        "every level past its ramp-up instead of measuring the highest ones on a single wave.",
    )
    warmup: int = Field(2, ge=0, description="Warm-up requests, excluded from results.")
    rounds: int = Field(3, ge=1, description="Measured rounds.")
    max_frames: int | None = Field(None, ge=1, description="Cap on frames per request.")
    out_dir: str | None = Field(None, description="Where the job's result JSON goes.")
    phase_timing: Literal["steps", "device"] = Field(
        "steps",
        description="What result.json's `steps` times: `steps`, each served step by kind "
        "(decode / mixed) on the host clock, perturbing nothing; `device`, also the forward, "
        "sample and audio phases, with a device synchronisation around each (exact phases, "
        "slower steps: for finding where a served step's time goes, not for throughput).",
    )
    reuse_pipeline: bool = Field(
        True,
        description="Keep the built pipeline for the sweep's next job when its stage graph is "
        "the same (jobs differing only in bench.* keys); false: every job builds its own.",
    )

    @property
    def round_prompts(self) -> int:
        """Prompts each round sends: num_prompts, raised to prompts_per_lane per lane."""
        return max(self.num_prompts, (self.prompts_per_lane or 0) * self.concurrency)


class OmniflowSpec(Frozen):
    """The whole validated configuration."""

    pipeline: PipelineConfig = Field(description="The stage graph.")
    model: ModelConfig = Field(description="The model preset.")
    platform: PlatformConfig = Field(description="The platform.")
    server: ServerConfig = Field(default_factory=ServerConfig, description="Server settings.")
    synth: SynthConfig = Field(default_factory=SynthConfig, description="Synth settings.")
    bench: BenchConfig = Field(default_factory=BenchConfig, description="Bench settings.")
