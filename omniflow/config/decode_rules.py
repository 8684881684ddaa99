"""Build-time rules of an AR stage's decode-step fields: the multi-step window
(`window_k`), the window's audio chunks (`audio_chunk_frames`), the playback margin that
sizes windows (`playback_margin_ms`) and the prompt graphs (`prompt_graph_tokens`), each
resolved (`null` means a platform-dependent default) and checked against the stage
(docs/architecture.md, "Configuration and build-time rules")."""

from __future__ import annotations

from omniflow.config.graph import ResolvedPlatform
from omniflow.config.schema import ARStageConfig, StageConfig
from omniflow.core.capabilities import ModelCapabilities
from omniflow.errors import ConfigError

WINDOW_MAX = 16
DEFAULT_WINDOW_K = 8
"""`window_k: null` where CUDA graphs are captured (`resolved_window_k`)."""

DEFAULT_PROMPT_GRAPH_TOKENS = 512
"""What `prompt_graph_tokens: null` means with CUDA graphs: a replayed prefill skips the
host launches an eager one pays per layer (measured: see docs/performance.md), and 512
tokens cover a few new prompts per step while keeping the buckets' graph pool small (it is
not counted by the KV sizing)."""


def resolved_prompt_graph_tokens(stage: StageConfig, platform: ResolvedPlatform | None) -> int:
    """The stage's value, or for `null` the default where graphs are captured (never above
    the step's token budget) and 0 where they are not: a flat padded prefill run eagerly
    only costs padding."""
    if not isinstance(stage, ARStageConfig):
        return 0
    if stage.prompt_graph_tokens is not None:
        return stage.prompt_graph_tokens
    if platform is None or not platform.cuda_graphs:
        return 0
    return min(DEFAULT_PROMPT_GRAPH_TOKENS, stage.scheduler.max_num_batched_tokens)


def check_prompt_graphs(key: str, stage: StageConfig, errors: list[ConfigError]) -> None:
    """A prompt-graph bucket above the step's token budget could never be used, yet would be
    captured (memory and start-up time for nothing)."""
    if not isinstance(stage, ARStageConfig) or stage.prompt_graph_tokens is None:
        return
    n, budget = stage.prompt_graph_tokens, stage.scheduler.max_num_batched_tokens
    if n > budget:
        errors.append(
            ConfigError(
                f"{key}.prompt_graph_tokens",
                f"{n} exceeds scheduler.max_num_batched_tokens ({budget}): a step never holds "
                "that many tokens",
            )
        )


def resolved_window_k(
    stage: StageConfig, cap: ModelCapabilities, platform: ResolvedPlatform | None
) -> int:
    """The stage's value, or for `null` DEFAULT_WINDOW_K on a stage that can take windows
    where CUDA graphs are captured, 0 elsewhere: a window runs K decode steps in one
    scheduling round, so the host's per-step work is paid once per K tokens and the window's
    frames decode in one pass, codes unchanged (measured: see docs/performance.md); on the
    CPU the compute, not the host, bounds a step, so a window buys nothing."""
    if stage.window_k is not None:
        return stage.window_k
    if platform is None or not platform.cuda_graphs:
        return 0
    # (the other window rules, parallel sizes, prefix caching, speculation, are refused
    # outright in this version: `check_unsupported` in stage_rules.py)
    return DEFAULT_WINDOW_K if stage.kind == "ar" and cap.supports_window else 0


def check_audio_chunks(key: str, stage: StageConfig, k: int, errors: list[ConfigError]) -> None:
    """Chunks only exist inside windows of a stage that decodes its own audio, and must tile
    a full window: each pass is then one replay of the captured chunk graph. A chunk of the
    whole window (C = K) is one pass at the window's end, as without chunks, but on the
    decoder's own CUDA stream, beside the next window's steps (`worker/step_audio.py`)."""
    if not isinstance(stage, ARStageConfig) or not stage.audio_chunk_frames:
        return  # null or 0: nothing to check (null resolves to K or 0: resolved_audio_chunk_frames)
    c = stage.audio_chunk_frames
    ckey = f"{key}.audio_chunk_frames"
    if not stage.stream_decode:
        errors.append(ConfigError(ckey, "requires stream_decode: true (no audio to decode)"))
    elif k < 2:
        why = (
            "; null is 8 only where CUDA graphs are captured: set window_k"
            if stage.window_k is None
            else ""
        )
        errors.append(ConfigError(ckey, f"requires window_k >= 2 (window_k is {k}){why}"))
    elif c < 2 or c > k or k % c:  # a pass of one frame is the per-frame decoder step
        fits = [d for d in range(2, k + 1) if k % d == 0]
        errors.append(
            ConfigError(
                ckey, f"must be a divisor of window_k ({k}) from 2 to {k}: one of {fits}, got {c}"
            )
        )


def check_audio_passes(key: str, stage: StageConfig, errors: list[ConfigError]) -> None:
    """Held frames are a stage's own audio (`sched/audio_cycle.py`); a pass of one step's
    frames is what 0 already does."""
    if not isinstance(stage, ARStageConfig) or not stage.audio_pass_steps:
        return
    pkey = f"{key}.audio_pass_steps"
    if stage.audio_pass_steps == 1:
        errors.append(ConfigError(pkey, "must be 0 (off) or 2 to 16: one step a pass is 0"))
    elif not stage.stream_decode:
        errors.append(
            ConfigError(pkey, "requires stream_decode: true (the stage decodes no audio itself)")
        )


def resolved_audio_pass_steps(stage: StageConfig) -> int:
    return stage.audio_pass_steps if isinstance(stage, ARStageConfig) else 0


def resolved_audio_chunk_frames(
    stage: StageConfig, k: int, platform: ResolvedPlatform | None
) -> int:
    """The stage's value, or for `null` the whole window (C = K: its audio in one pass on the
    decoder's own CUDA stream) on a stage that decodes its own audio in windows where CUDA
    graphs are captured, 0 elsewhere. On its own stream a window's audio pass no longer
    delays the next step, above all an arrival's prefill (measured: see
    docs/performance.md); without CUDA there is no second stream."""
    if not isinstance(stage, ARStageConfig):
        return 0
    if stage.audio_chunk_frames is not None:
        return stage.audio_chunk_frames
    if platform is None or platform.name != "cuda" or not platform.cuda_graphs:
        return 0
    return k if k >= 2 and stage.stream_decode else 0


def resolved_playback_margin(stage: StageConfig, k: int) -> int | None:
    """The margin of the stage's playback clock: it sizes windows, and on a stage that
    decodes its own audio it also tells admission control and the seating what a stream can
    wait, with or without windows (None: no clock; without windows a stage whose frames go
    to a code2wav stage has no playback of its own to keep)."""
    if not isinstance(stage, ARStageConfig) or (k < 2 and not stage.stream_decode):
        return None
    return stage.playback_margin_ms


def check_resident_seqs(key: str, stage: StageConfig, k: int, errors: list[ConfigError]) -> None:
    """More residents than rows take turns by playback deadline: without a playback clock
    (`playback_margin_ms`) nothing would choose who sits out, so the key could not act."""
    if not isinstance(stage, ARStageConfig):
        return
    s = stage.scheduler
    if s.max_resident_seqs is None:
        return
    rkey = f"{key}.scheduler.max_resident_seqs"
    if s.max_resident_seqs < s.max_num_seqs:
        errors.append(
            ConfigError(
                rkey,
                f"{s.max_resident_seqs} is below max_num_seqs {s.max_num_seqs}: every running "
                "request holds a seat; set it >= max_num_seqs (or null)",
            )
        )
    elif s.max_resident_seqs > s.max_num_seqs and not stage.stream_decode:
        errors.append(
            ConfigError(
                rkey,
                f"above max_num_seqs {s.max_num_seqs} needs stream_decode: true (the fused "
                "pipeline): the stage holds each resident stream's decoder, which a separate "
                "code2wav stage's max_num_seqs would have to match",
            )
        )
    elif s.max_resident_seqs > s.max_num_seqs and resolved_playback_margin(stage, k) is None:
        errors.append(
            ConfigError(
                rkey,
                f"above max_num_seqs {s.max_num_seqs}, streams take turns by playback deadline: "
                "that needs playback_margin_ms (the playback clock; it is null)",
            )
        )


def check_window(
    key: str,
    stage: StageConfig,
    cap: ModelCapabilities,
    platform: ResolvedPlatform | None,
    errors: list[ConfigError],
) -> None:
    k = stage.window_k
    if not k:  # off, or null: resolved to what the stage can take (`resolved_window_k`)
        return
    wkey = f"{key}.window_k"
    if k == 1 or k < 0 or k > WINDOW_MAX:
        errors.append(ConfigError(wkey, f"must be 0 (off) or 2..{WINDOW_MAX}, got {k}"))
        return
    reasons = []
    if stage.kind != "ar":
        reasons.append(f"requires kind 'ar' (stage kind is {stage.kind!r})")
    if not cap.supports_window:
        reasons.append(f"arch {stage.arch!r} does not declare multi-step window support")
    # parallel sizes, prefix caching and speculative tokens are refused on their own while
    # not implemented (`stage_rules.check_unsupported`): one error each, not one per rule
    errors.extend(ConfigError(wkey, r) for r in reasons)


def check_arrival_hold(
    key: str, stage: StageConfig, k: int, wait_limit_s: float | None, errors: list[ConfigError]
) -> None:
    """Held arrivals wait while the running streams run windows sized to end when the hold
    does, at the measured step time: without windows or the clock the key could not act.
    Admission control counts the hold in a request's expected wait: one as long as
    `server.max_first_audio_wait_s` would refuse every request arriving while streams run.
    `arrival_hold_min_running` acts only with a hold, and only up to the streams the stage
    can hold at once."""
    if not isinstance(stage, ARStageConfig):
        return
    sched = stage.scheduler
    least = sched.arrival_hold_min_running
    seats = max(sched.max_num_seqs, sched.max_resident_seqs or 0)
    off = (  # a user may meet these without having set a hold: say where one comes from
        "; experiment=high_concurrency holds arrivals with the fused pipeline on platform=cuda "
        f"(conf/hold/high_concurrency_cuda.yaml); no hold: {key}.scheduler.arrival_hold_ms=0 "
        f"{key}.scheduler.arrival_hold_min_running=1"
    )
    why = None
    if least > 1 and not sched.arrival_hold_ms:
        why = (
            "says from how many running streams arrivals are held; with arrival_hold_ms 0 "
            "nothing is held: set arrival_hold_ms or leave this at 1"
        )
    elif least > 1 and least >= seats:
        why = (
            f"{least} is not below the streams the stage holds ({seats}: max_num_seqs, or "
            "max_resident_seqs above it): a seat frees only when fewer run, so nothing would "
            "ever be held" + off
        )
    if why is not None:
        errors.append(ConfigError(f"{key}.scheduler.arrival_hold_min_running", why))
    if not sched.arrival_hold_ms:
        return
    hold_ms = sched.arrival_hold_ms
    if wait_limit_s is not None and hold_ms >= 1000 * wait_limit_s:
        errors.append(
            ConfigError(
                f"{key}.scheduler.arrival_hold_ms",
                f"{hold_ms:g} ms is not below server.max_first_audio_wait_s ({wait_limit_s:g} s): "
                "admission control counts the hold, so every request arriving while streams "
                "run would be refused; lower the hold or raise that limit" + off,
            )
        )
    if k < 2 or resolved_playback_margin(stage, k) is None:
        errors.append(
            ConfigError(
                f"{key}.scheduler.arrival_hold_ms",
                "holds arrivals while the running streams run windows sized by the playback "
                f"clock: it needs window_k >= 2 (resolved: {k}) and playback_margin_ms (not "
                "null)" + off,
            )
        )
