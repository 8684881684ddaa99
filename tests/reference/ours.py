"""The omniflow side of the reference comparison: a checkpoint in the published layout,
loaded by omniflow's strict loaders, and the same quantities the official side computes.

The checkpoint is written from the fixture: the official config.json files as the official
classes saved them, and every tensor name and shape the official state dict has, filled by
`weights.draw`. So the loaders meet the published layout (0 missing, 0 extra tensors) and
the config cross-check meets the official spelling.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.config.schema import SchedulerConfig
from omniflow.core.speech import SpeechRequest
from omniflow.engine.stage_engine import StageEngine
from omniflow.models.interface import PositionSpan
from omniflow.models.layers.attention import PagedAttentionMetadata
from omniflow.models.qwen3_tts import inputs
from omniflow.models.qwen3_tts.ar_model import build_ar_model
from omniflow.models.qwen3_tts.codec_encoder import (
    CodecEncoderShape,
    CodecEncoderWeights,
    load_codec_encoder,
)
from omniflow.models.qwen3_tts.codec_loader import load_codec
from omniflow.models.qwen3_tts.codec_modules import SpeechTokenizerWeights
from omniflow.models.qwen3_tts.codec_stream import StreamingDecoder
from omniflow.models.qwen3_tts.factory import TalkerBundle, build_talker
from omniflow.models.qwen3_tts.processor import CloneShape, TalkerProcessor
from omniflow.models.qwen3_tts.prompt import TalkerPrompt
from omniflow.models.qwen3_tts.speaker_encoder import (
    SpeakerEncoderShape,
    SpeakerEncoderWeights,
    load_speaker_encoder,
)
from omniflow.models.shapes import ModelConfig
from omniflow.sched.ar import ARScheduler
from omniflow.worker.ar_runner import ARModelRunner
from tests.reference.cases import CloneCase, Fixture, PromptCase
from tests.reference.weights import draw_all

CPU = torch.device("cpu")


def write_checkpoint(
    directory: Path, fx: Fixture, seed: int | None = None, talker_config: dict | None = None
) -> Path:
    """The fixture's checkpoint in the published layout: config.json + model.safetensors +
    speech_tokenizer/, weights drawn with `seed` (the fixture's own by default);
    `talker_config` in place of the fixture's (a tampered one)."""
    seed = fx.meta["seed"] if seed is None else seed
    st = directory / "speech_tokenizer"
    st.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(talker_config or fx.talker_config))
    (st / "config.json").write_text(json.dumps(fx.codec_config))
    save_file(draw_all(fx.talker_shapes, seed), str(directory / "model.safetensors"))
    save_file(draw_all(fx.codec_shapes, seed), str(st / "model.safetensors"))
    return directory


def model_config(preset: str, path: Path, *overrides: str) -> ModelConfig:
    """The preset, loading `path` with the byte tokenizer (the fixtures' text ids), fp32."""
    spec = compose(
        [
            "platform=cpu",
            f"model={preset}",
            f"model.path={path}",
            "model.tokenizer=byte",
            "model.dtype=float32",
            *overrides,
        ]
    )
    return build_graph(spec).model


@dataclass(frozen=True)
class Loaded:
    bundle: TalkerBundle
    codec: SpeechTokenizerWeights
    model: ModelConfig
    encoder: CodecEncoderWeights | None
    speaker: SpeakerEncoderWeights | None
    """Both None: a VoiceDesign checkpoint (`load_talker`), which has no speaker encoder."""


def load_talker(model: ModelConfig) -> Loaded:
    """The talker alone (a VoiceDesign checkpoint has no speaker encoder to load)."""
    assert model.path is not None
    d = Path(model.path)
    codec = load_codec(model.codec, d, 0)
    return Loaded(build_talker(model, CPU), codec, model, None, None)


def load(model: ModelConfig) -> Loaded:
    """Everything from the checkpoint directory by omniflow's strict loaders; the encoder and
    speaker encoder take their shapes from its config files (so any preset's talker can be
    compared; tests/models/test_base_preset.py loads them through the Base preset)."""
    assert model.path is not None
    d = Path(model.path)
    enc_shape = CodecEncoderShape.from_config(
        json.loads((d / "speech_tokenizer" / "config.json").read_text())
    )
    spk_cfg = json.loads((d / "config.json").read_text()).get("speaker_encoder_config", {})
    spk_shape = SpeakerEncoderShape.from_config(spk_cfg)
    return Loaded(
        build_talker(model, CPU),
        load_codec(model.codec, d, 0),
        model,
        load_codec_encoder(enc_shape, d, 0),
        load_speaker_encoder(spk_shape, d, 0),
    )


def processor(loaded: Loaded, max_model_len: int = 512) -> TalkerProcessor:
    b = loaded.bundle
    m = loaded.model
    clone = CloneShape(
        m.talker.hidden_size, m.code_predictor.num_code_groups, m.codec.codebook_size
    )
    return TalkerProcessor(
        b.tokenizer, b.vocab, max_model_len, clone=clone, voice_design=m.voice_design
    )


def speech(case: PromptCase, rid: str = "ref", **kw) -> SpeechRequest:
    return SpeechRequest.create(
        case.text,
        request_id=rid,
        voice=case.speaker,
        language=case.language,
        instructions=case.instruct,
        non_streaming_mode=case.non_streaming,
        **kw,
    )


def prompt(loaded: Loaded, case: PromptCase) -> TalkerPrompt:
    return processor(loaded).make_request(speech(case)).payload


def clone_prompt(loaded: Loaded, case: CloneCase, tensors: dict[str, torch.Tensor]) -> TalkerPrompt:
    """A voice-clone request carrying the fixture's speaker embedding and reference codes."""
    codes = tensors.get(f"clone/{case.name}/ref_codes")
    request = SpeechRequest.create(
        case.text,
        request_id="ref-clone",
        language=case.language,
        non_streaming_mode=case.non_streaming,
        speaker_embedding=tuple(tensors[f"clone/{case.name}/speaker"].tolist()),
        ref_codes=None if codes is None else tuple(map(tuple, codes.tolist())),
        ref_text=case.ref_text,
    )
    return processor(loaded).make_request(request).payload


@torch.no_grad()
def embeds(loaded: Loaded, p: TalkerPrompt, frames: torch.Tensor | None = None) -> torch.Tensor:
    """Input embeddings of the prompt and, with `frames` [K, 16], of K decode positions
    (the recompute path: prompt positions and stored frames in one prefill)."""
    k = 0 if frames is None else frames.shape[0]
    stored = [] if frames is None else [tuple(f) for f in frames.tolist()]
    span = PositionSpan(p, p.prompt_len, 0, p.prompt_len + k, stored)
    talker = loaded.bundle.talker
    x = inputs.prefill_inputs([span], talker.num_groups, CPU)
    return inputs.embed_prefill(talker, x)


@torch.no_grad()
def trailing(loaded: Loaded, p: TalkerPrompt, steps: int) -> torch.Tensor:
    """The text embedding each of `steps` decode steps adds."""
    t = loaded.bundle.talker.weights.talker
    ids = torch.tensor([p.trailing_at(i) for i in range(steps)])
    return t.text_projection(t.model.text_embedding(ids))


@torch.no_grad()
def talker_logits(loaded: Loaded, x: torch.Tensor) -> torch.Tensor:
    """Codebook-0 logits at every position of one sequence, through the paged forward."""
    talker = loaded.bundle.talker
    n = x.shape[0]
    shape = talker.shape
    slots = torch.arange(n)
    meta = PagedAttentionMetadata(slots, (0, n), (n,), (slots,))
    caches = [
        (
            torch.zeros(n, shape.num_kv_heads, shape.head_dim),
            torch.zeros(n, shape.num_kv_heads, shape.head_dim),
        )
        for _ in range(shape.num_layers)
    ]
    return talker.logits(talker.forward(x, torch.arange(n), meta, caches))


@torch.no_grad()
def predictor_logits(loaded: Loaded, hidden: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """[B, 15, codebook] logits of codebooks 1..15 with `codes` [B, 16] fed back."""
    talker = loaded.bundle.talker
    seen: list[torch.Tensor] = []

    def teacher(logits: torch.Tensor, g: int) -> torch.Tensor:
        seen.append(logits)
        return codes[:, g]

    emb0 = talker.weights.talker.model.codec_embedding(codes[:, 0])
    talker.predictor.predict(hidden, emb0, teacher)
    return torch.stack(seen, dim=1)


@torch.no_grad()
def codec_pcm(loaded: Loaded, codes: torch.Tensor) -> torch.Tensor:
    """Full-sequence decode of codes [T, 16]."""
    return loaded.codec.decoder(codes[None])[0]


@torch.no_grad()
def codec_pcm_streamed(loaded: Loaded, codes: torch.Tensor, chunk: int) -> torch.Tensor:
    """The streaming decoder (the pipelines' path), `chunk` frames at a time."""
    dec = StreamingDecoder(loaded.codec.decoder, 1, CPU, torch.float32)
    slot = dec.allocate()
    parts = [
        dec.decode([slot], [codes[start : start + chunk]])[0]
        for start in range(0, codes.shape[0], chunk)
    ]
    dec.release(slot)
    return torch.cat(parts)


def greedy(loaded: Loaded, case: PromptCase, max_new_tokens: int) -> list[tuple[int, ...] | None]:
    """The frames of a greedy request (temperature 0) run through the AR engine."""
    cfg = SchedulerConfig(max_model_len=512, block_size=4, num_kv_blocks=256)
    runner = ARModelRunner(build_ar_model(loaded.bundle), cfg, CPU, torch.float32)
    engine = StageEngine("talker", ARScheduler(cfg), runner)
    request = speech(case, seed=0, temperature=0.0, max_new_tokens=max_new_tokens)
    engine.add_request(processor(loaded).make_request(request))
    outputs = engine.run_until_idle()
    return [f for o in outputs for f in o.frames]


def measure(loaded: Loaded, tensors: dict[str, torch.Tensor]) -> dict[str, float]:
    """Max abs difference of every compared quantity (the official `outputs` vs omniflow);
    greedy generations give 0.0 when omniflow's frames start with the official ones, else
    inf. The per-quantity tests in test_reference_fixtures.py say the same, one by one."""
    from tests.reference.cases import (
        CASES,
        CLONE_CASES,
        GREEDY_CASES,
        LOGIT_CASES,
        PROMPT_CASES,
    )

    def diff(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a.float() - b.float()).abs().max()) if a.shape == b.shape else math.inf

    out: dict[str, float] = {}
    for case in PROMPT_CASES:
        out[f"prompt/{case.name}"] = diff(
            embeds(loaded, prompt(loaded, case)), tensors[f"prompt/{case.name}/embeds"]
        )
    for clone in CLONE_CASES:
        out[f"clone/{clone.name}"] = diff(
            embeds(loaded, clone_prompt(loaded, clone, tensors)),
            tensors[f"clone/{clone.name}/embeds"],
        )
    for name in LOGIT_CASES:
        x = embeds(loaded, prompt(loaded, CASES[name]), tensors[f"logits/{name}/frames"])
        out[f"logits/{name}"] = diff(talker_logits(loaded, x), tensors[f"logits/{name}/logits"])
    hidden, codes = tensors["predictor/hidden"], tensors["predictor/codes"]
    out["predictor"] = diff(predictor_logits(loaded, hidden, codes), tensors["predictor/logits"])
    out["codec"] = diff(codec_pcm(loaded, tensors["codec/codes"]), tensors["codec/pcm"])
    codes = loaded.encoder.encode(tensors["encoder/audio"][None])[0]
    out["encoder"] = 0.0 if codes.equal(tensors["encoder/codes"]) else math.inf
    audio = tensors["speaker/audio"][None]
    out["mel"] = diff(loaded.speaker.mel(audio)[0], tensors["speaker/mel"])
    out["speaker"] = diff(loaded.speaker.embed(audio)[0], tensors["speaker/embedding"])
    for name in GREEDY_CASES:
        theirs = tensors[f"greedy/{name}/codes"]
        frames = greedy(loaded, CASES[name], theirs.shape[0] + 1)
        same = None not in frames and torch.tensor(frames[: theirs.shape[0]]).equal(theirs)
        out[f"greedy/{name}"] = 0.0 if same else math.inf
    return out
