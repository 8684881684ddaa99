"""Build-time rules: validated spec -> resolved, immutable stage graph.

Every rule that involves more than one field (the model's declared capabilities, the platform,
other stages) is applied here, once. Each violation becomes a `ConfigError` naming the key
path and the rule; all violations of one config are reported together.
"""

from __future__ import annotations

from omniflow.config.decode_rules import (
    check_arrival_hold,
    check_audio_chunks,
    check_audio_passes,
    check_prompt_graphs,
    check_resident_seqs,
    check_window,
    resolved_audio_chunk_frames,
    resolved_audio_pass_steps,
    resolved_playback_margin,
    resolved_prompt_graph_tokens,
    resolved_window_k,
)
from omniflow.config.graph import ResolvedStage, StageGraph, receives_chunks
from omniflow.config.model_rules import resolve_model
from omniflow.config.resolve_platform import resolve_platform, settle_cudnn_benchmark
from omniflow.config.schema import OmniflowSpec
from omniflow.config.stage_rules import (
    check_chunk_budget,
    check_kv_capacity,
    check_stream_decode,
    check_unsupported,
    resolve_ref_context,
)
from omniflow.core.capabilities import ARCH_CAPABILITIES, ModelCapabilities
from omniflow.errors import ConfigError, ConfigErrors


def build_graph(spec: OmniflowSpec, *, engine_here: bool = False) -> StageGraph:
    """Apply every build-time rule; raise `ConfigError` (or `ConfigErrors`) on violations.
    `engine_here`: a command without a server beside the engine (synth) or one that reaches
    into its steps (the bench's device phase timing) keeps the engine in its own process
    where `pipeline.runtime` is left null."""
    errors: list[ConfigError] = []
    platform = resolve_platform(spec.platform, spec.model, errors)
    model = resolve_model(spec.model, platform, errors)
    stages = spec.pipeline.stages
    caps = _stage_caps(spec, errors)
    order, final, downstream = _topology(spec, caps, errors)
    if spec.pipeline.runtime == "ray" and len(stages) == 1:
        errors.append(
            ConfigError(
                "pipeline.runtime",
                f"ray places each stage in its own actor, and pipeline {spec.pipeline.name!r} "
                "has one stage (fused): use pipeline.runtime=in_process (deploy=ray for "
                "replicas of it), or a two-stage pipeline (pipeline=qwen3_tts)",
            )
        )
    if spec.server.warmup_frames and spec.model.task_type == "Base":
        errors.append(
            ConfigError(
                "server.warmup_frames",
                f"model {spec.model.name!r} is a Base model: every request needs a reference "
                "(ref_audio), so the server has no warm-up request to make; leave it null or 0",
            )
        )
    resolved: dict[str, ResolvedStage] = {}
    for name in order:
        stage = stages[name]
        if name not in caps:
            continue
        key = f"pipeline.stages.{name}"
        cap = caps[name]
        is_final = name == final
        check_unsupported(key, stage, errors)
        check_window(key, stage, cap, platform, errors)
        check_stream_decode(spec, key, stage, cap, is_final, errors)
        output = "audio" if stage.stream_decode else cap.output
        if is_final and output != "audio":
            errors.append(
                ConfigError(
                    f"{key}.stream_decode",
                    f"final stage {name!r} emits {output}, not audio: it would serve empty "
                    "audio; set stream_decode: true (fused pipeline) or add a code2wav stage",
                )
            )
        decodes_audio = stage.stream_decode or cap.decodes_audio
        k = resolved_window_k(stage, cap, platform)
        ref = resolve_ref_context(key, stage, decodes_audio, cap, spec.model, errors)
        if cap.stage_kind == "ar":
            check_kv_capacity(key, stage, errors)
            check_prompt_graphs(key, stage, errors)
            check_audio_chunks(key, stage, k, errors)
            check_audio_passes(key, stage, errors)
            check_resident_seqs(key, stage, k, errors)
            check_arrival_hold(key, stage, k, spec.server.max_first_audio_wait_s, errors)
        if stage.upstream is not None:
            check_chunk_budget(key, stage, spec.model, errors)
        resolved[name] = ResolvedStage(
            name=name,
            kind=stage.kind,
            arch=stage.arch,
            window_k=k,
            prompt_graph_tokens=resolved_prompt_graph_tokens(stage, platform),
            audio_chunk_frames=resolved_audio_chunk_frames(stage, k, platform),
            playback_margin_ms=resolved_playback_margin(stage, k),
            audio_pass_steps=resolved_audio_pass_steps(stage),
            stream_decode=stage.stream_decode,
            ref_context_frames=ref,
            receives_chunks=receives_chunks(stage),
            atomic_chunks=receives_chunks(stage),
            output=output,
            upstream=stage.upstream,
            downstream=downstream.get(name),
            is_final=is_final,
            scheduler=stage.scheduler,
        )
    if errors:
        raise errors[0] if len(errors) == 1 else ConfigErrors(errors)
    assert platform is not None and final is not None
    platform = settle_cudnn_benchmark(spec.platform, platform, resolved)
    return StageGraph(
        pipeline=spec.pipeline.name,
        runtime=resolved_runtime(spec, platform.name, engine_here),
        stages=resolved,
        final_stage=final,
        platform=platform,
        model=model,
    )


def resolved_runtime(spec: OmniflowSpec, platform: str, engine_here: bool) -> str:
    """`pipeline.runtime: null` resolved. The engine runs in a process of its own on CUDA,
    where a GPU-bound engine loop and the HTTP side would share one interpreter lock
    (docs/performance.md, "The engine in its own process"); in-process on other platforms,
    in a Ray replica (a process of its own already) and for a command that asks for it
    (`build_graph`'s `engine_here`)."""
    if spec.pipeline.runtime is not None:
        return spec.pipeline.runtime
    if platform != "cuda" or spec.deploy.name == "ray" or engine_here:
        return "in_process"
    return "process"


# --------------------------------------------------------------------------- topology


def _stage_caps(spec: OmniflowSpec, errors: list[ConfigError]) -> dict[str, ModelCapabilities]:
    caps: dict[str, ModelCapabilities] = {}
    for name, stage in spec.pipeline.stages.items():
        key = f"pipeline.stages.{name}.arch"
        cap = ARCH_CAPABILITIES.get(stage.arch)
        if cap is None:
            known = sorted(ARCH_CAPABILITIES)
            errors.append(ConfigError(key, f"unknown arch {stage.arch!r}; known: {known}"))
            continue
        if cap.family != spec.model.family:
            errors.append(
                ConfigError(
                    key,
                    f"{stage.arch!r} is a {cap.family} component, but the model "
                    f"family is {spec.model.family!r}",
                )
            )
            continue
        if cap.stage_kind != stage.kind:
            errors.append(
                ConfigError(
                    key,
                    f"{stage.arch!r} runs in a {cap.stage_kind!r} stage, not kind {stage.kind!r}",
                )
            )
            continue
        caps[name] = cap
    return caps


def _topology(
    spec: OmniflowSpec, caps: dict[str, ModelCapabilities], errors: list[ConfigError]
) -> tuple[list[str], str | None, dict[str, str]]:
    """Check edges; return stages in topological order, the final stage, downstream map."""
    stages = spec.pipeline.stages
    downstream: dict[str, str] = {}
    for name, stage in stages.items():
        key = f"pipeline.stages.{name}.upstream"
        cap = caps.get(name)
        if stage.upstream is None:
            if cap is not None and cap.accepts is not None:
                errors.append(
                    ConfigError(
                        key,
                        f"{stage.arch!r} receives {cap.accepts} from an upstream "
                        "stage: set upstream.stage",
                    )
                )
            continue
        src = stage.upstream.stage
        if src == name or src not in stages:
            errors.append(
                ConfigError(
                    f"{key}.stage",
                    f"{src!r} is not another stage of this pipeline (stages: {sorted(stages)})",
                )
            )
            continue
        if src in downstream:
            errors.append(
                ConfigError(
                    f"{key}.stage",
                    f"stage {src!r} already feeds {downstream[src]!r}; fan-out is not supported",
                )
            )
            continue
        downstream[src] = name
        src_cap = caps.get(src)
        if cap is not None and src_cap is not None:
            src_out = "audio" if stages[src].stream_decode else src_cap.output
            if cap.accepts != src_out:
                errors.append(
                    ConfigError(
                        key, f"{stage.arch!r} accepts {cap.accepts}, but {src!r} emits {src_out}"
                    )
                )
    # Topological order by walking upstream chains (each stage has at most one upstream).
    order: list[str] = []
    for name in stages:
        chain: list[str] = []
        cur: str | None = name
        while cur is not None and cur not in order and cur not in chain:
            chain.append(cur)
            up = stages[cur].upstream
            cur = up.stage if up is not None and up.stage in stages else None
        if cur is not None and cur in chain:
            errors.append(ConfigError("pipeline.stages", f"cycle through stage {cur!r}"))
            return list(stages), None, downstream
        order.extend(reversed(chain))
    finals = [n for n in stages if n not in downstream]
    if len(finals) != 1:
        errors.append(
            ConfigError("pipeline.stages", f"expected exactly one final stage, got {finals}")
        )
        return order, None, downstream
    return order, finals[0], downstream
