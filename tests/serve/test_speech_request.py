"""`SpeechRequest.create`, the one constructor every front end uses (serve, synth, bench)."""

from __future__ import annotations

from omniflow.core.speech import SpeechRequest


def test_ids_are_generated_unique_with_the_front_ends_prefix_or_kept():
    a = SpeechRequest.create("Hi.", id_prefix="synth")
    b = SpeechRequest.create("Hi.", id_prefix="synth")
    assert a.request_id.startswith("synth-") and len(a.request_id) == len("synth-") + 32
    assert a.request_id != b.request_id
    assert SpeechRequest.create("Hi.").request_id.startswith("speech-")
    assert SpeechRequest.create("Hi.", request_id="r7").request_id == "r7"


def test_user_typed_names_are_normalised_and_blanks_mean_unset():
    r = SpeechRequest.create(
        "  Keep my spacing. ",
        voice=" Vivian ",
        language="English ",
        instructions="   ",
        seed=3,
        max_new_tokens=9,
        ignore_eos=True,
        initial_chunk_frames=2,
    )
    assert r.text == "  Keep my spacing. "  # the text is the user's, untouched
    assert (r.voice, r.language, r.instructions) == ("vivian", "english", None)
    assert (r.seed, r.max_new_tokens, r.ignore_eos, r.initial_chunk_frames) == (3, 9, True, 2)
    assert SpeechRequest.create("x", language=None).language == "auto"
    assert SpeechRequest.create("x", language=" ").language == "auto"
    assert SpeechRequest.create("x").voice is None
    assert SpeechRequest.create("x", instructions="Warmly.").instructions == "Warmly."
