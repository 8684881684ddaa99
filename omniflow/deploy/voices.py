"""The voice registry shared by every replica: one Ray actor holding serve/voices.py's own
`VoiceRegistry`, and, in each replica, a stand-in with the registry's methods that calls it.

A voice registered through one replica (`POST /v1/audio/voices`) is then listed, spoken
with and deleted through any of them; `server.max_voices` bounds them all together. The
actor belongs to the `omniflow serve` process that started the replicas: it goes when that
process stops, as the in-process registry does."""

from __future__ import annotations

from typing import Any

import ray

from omniflow.serve.voices import Clone, RegisteredVoice, VoiceRegistry

VoiceStore = ray.remote(num_cpus=0)(VoiceRegistry)
"""`VoiceRegistry` as an actor (no CPU held: it only keeps the voices)."""


def voice_store(capacity: int) -> Any:
    """A new store (its handle goes to every replica)."""
    return VoiceStore.remote(capacity)


class SharedVoices:
    """In a replica, what `VoiceService.registry` calls, answered by the store. A call is
    one round trip to the actor; `RegistryFull` raised there is raised here (Ray re-raises
    an actor's exception as an instance of its class)."""

    def __init__(self, store: Any, capacity: int) -> None:
        self.store = store
        self.capacity = capacity

    def reserve(self) -> None:
        ray.get(self.store.reserve.remote())

    def add(self, name: str, clone: Clone) -> RegisteredVoice:
        return ray.get(self.store.add.remote(name, clone))

    def cancel(self) -> None:
        ray.get(self.store.cancel.remote())

    def get(self, voice_id: str) -> RegisteredVoice | None:
        return ray.get(self.store.get.remote(voice_id))

    def remove(self, voice_id: str) -> bool:
        return ray.get(self.store.remove.remote(voice_id))

    def voices(self) -> list[RegisteredVoice]:
        return ray.get(self.store.voices.remote())
