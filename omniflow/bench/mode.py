"""Which loop a bench job runs, and the keys each one reads.

Closed loop (the default): `bench.rounds` rounds of `bench.num_prompts` requests at
`bench.concurrency` in flight, each lane sending its next request when its previous one ends.
Open loop (`bench.rps` set): requests arrive at that rate whether or not earlier ones have
ended (omniflow/bench/open_client.py). A key either acts in the job's loop or is refused,
naming it: the open-loop keys need `bench.rps`, and the closed loop's own keys, set to
anything but their defaults, are refused beside it. `bench.warmup`, `bench.max_frames`,
`bench.prompts` and the rest act in both. `bench.transport=websocket` (incremental sessions,
omniflow/bench/ws_client.py) is open loop only, and `bench.word_interval_ms` acts with it only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from omniflow.bench.arrivals import Arrivals
from omniflow.config.commands import BenchConfig
from omniflow.errors import ConfigError, ConfigErrors

OPEN_LOOP_KEYS = ("arrivals", "duration_s", "warmup_s", "seed", "drain_s")
"""Open loop only: unset (null) unless `bench.rps` is."""
CLOSED_LOOP_KEYS = ("concurrency", "num_prompts", "prompts_per_lane", "rounds")
"""Closed loop only: left at their defaults beside `bench.rps`."""

DEFAULT_ARRIVALS: Arrivals = "poisson"
DEFAULT_DURATION_S = 60.0
DEFAULT_WARMUP_S = 10.0
DEFAULT_SEED = 0
DEFAULT_DRAIN_S = 120.0

Transport = Literal["http", "websocket"]


@dataclass(frozen=True)
class Plan:
    """An open-loop run: arrivals at `rps` from 0 to warmup_s + duration_s; those from warmup_s
    on are measured; `drain_s` after the window closes, any still running are aborted."""

    rps: float
    arrivals: Arrivals = DEFAULT_ARRIVALS
    duration_s: float = DEFAULT_DURATION_S
    warmup_s: float = DEFAULT_WARMUP_S
    seed: int = DEFAULT_SEED
    drain_s: float = DEFAULT_DRAIN_S
    transport: Transport = "http"
    word_interval_ms: float | None = None
    """websocket only: the pause between a session's words (its text is sent word by word)."""

    @property
    def window(self) -> tuple[float, float]:
        """The measured window, in seconds from the run's start: [start, end)."""
        return self.warmup_s, self.warmup_s + self.duration_s


def check_mode(bench: BenchConfig) -> None:
    """Refuse a key the job's loop would not read (ConfigError naming it)."""
    errors = []
    if bench.rps is None:
        for key in OPEN_LOOP_KEYS:
            if getattr(bench, key) is not None:
                errors.append(
                    ConfigError(
                        f"bench.{key}",
                        "an open-loop key: it needs bench.rps=R (requests arriving per "
                        "second); without bench.rps the job is closed loop (bench.concurrency "
                        "requests in flight, bench.rounds rounds of bench.num_prompts)",
                    )
                )
    else:
        for key in CLOSED_LOOP_KEYS:
            default = BenchConfig.model_fields[key].default
            if getattr(bench, key) != default:
                errors.append(
                    ConfigError(
                        f"bench.{key}",
                        f"a closed-loop key, and bench.rps={bench.rps:g} makes the job open "
                        "loop: requests arrive at that rate for bench.duration_s, and as many "
                        f"are in flight as that makes; leave bench.{key} at its default "
                        f"({'null' if default is None else default}) or drop bench.rps",
                    )
                )
    errors += _transport_errors(bench)
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise ConfigErrors(errors)


def open_plan(bench: BenchConfig) -> Plan:
    """The open-loop run `bench` asks for (bench.rps set), unset keys at their defaults."""
    assert bench.rps is not None
    return Plan(
        rps=bench.rps,
        arrivals=bench.arrivals or DEFAULT_ARRIVALS,
        duration_s=DEFAULT_DURATION_S if bench.duration_s is None else bench.duration_s,
        warmup_s=DEFAULT_WARMUP_S if bench.warmup_s is None else bench.warmup_s,
        seed=DEFAULT_SEED if bench.seed is None else bench.seed,
        drain_s=DEFAULT_DRAIN_S if bench.drain_s is None else bench.drain_s,
        transport=bench.transport,
        word_interval_ms=bench.word_interval_ms if bench.transport == "websocket" else None,
    )


def _transport_errors(bench: BenchConfig) -> list[ConfigError]:
    """websocket needs the open loop; word_interval_ms needs websocket."""
    errors = []
    if bench.transport == "websocket" and bench.rps is None:
        errors.append(
            ConfigError(
                "bench.transport",
                "websocket runs the open loop only: each arrival is a session of its own, "
                "fed its text a word at a time; set bench.rps=R (sessions arriving per "
                "second), or drop bench.transport for the closed loop over HTTP",
            )
        )
    default = BenchConfig.model_fields["word_interval_ms"].default
    if bench.transport != "websocket" and bench.word_interval_ms != default:
        errors.append(
            ConfigError(
                "bench.word_interval_ms",
                f"the pace of a WebSocket session's words, and bench.transport={bench.transport} "
                "sends each text whole; set bench.transport=websocket (with bench.rps) or leave "
                f"bench.word_interval_ms at its default ({default:g})",
            )
        )
    return errors
