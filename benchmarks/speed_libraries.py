"""Time-scale modification libraries compared on speech-like audio (docs/speed.md).

The signal is synthetic speech: voiced syllables (a gliding fundamental, two moving
formants), fricative noise and pauses, made from functions of normalized time, so the same
signal made at duration/speed is the ideal stretch to compare against. Per library and
speed: the length error, the log-spectral distance to the ideal (dB, frames aligned by
time), the level (output RMS over input RMS), the fundamental's ratio, CPU ms per second
of input (best of 3), and, for streaming, the audio fed in 80 ms chunks (one codec frame):
the largest step at a join over the largest step elsewhere, and the largest difference to
the whole-buffer output. A library without a streaming API is run chunk by chunk, each
chunk stretched alone (what streaming with it would take).

Not a dependency of omniflow: run it in a scratch environment with the candidates,
    pip install numpy scipy pedalboard audiotsm pytsmod python-stretch librosa pylibrb
    PYTHONPATH=. python benchmarks/speed_libraries.py
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from omniflow.serve.speed import TimeStretch

SR = 24000
CHUNK = 1920
DUR = 4.0
SPEEDS = (0.25, 0.5, 1.5, 2.0, 4.0)


def speechlike(dur: float) -> np.ndarray:
    n = int(round(dur * SR))
    u = np.arange(n) / n
    nsyl = 8
    seg = np.floor(u * nsyl).astype(int)
    pos = u * nsyl - seg
    f0 = 110 + 60 * np.sin(np.pi * u * 3) ** 2 + 20 * pos
    phase = np.cumsum(2 * np.pi * f0 / SR)
    rng = np.random.default_rng(0)
    f1, f2 = rng.uniform(300, 800, nsyl)[seg], rng.uniform(900, 2200, nsyl)[seg]
    voiced = np.zeros(n)
    for k in range(1, 60):
        fk = k * f0
        env = 1 / (1 + ((fk - f1) / 90) ** 2) + 0.6 / (1 + ((fk - f2) / 120) ** 2)
        env = (env + 0.3 / (1 + ((fk - 2700) / 200) ** 2)) * (fk < SR / 2 - 500)
        voiced += env * np.sin(k * phase) / k**0.5
    gate = np.clip(np.minimum(pos / 0.15, (0.75 - pos) / 0.15), 0, 1)
    sig = voiced * np.sin(np.pi * np.clip(pos / 0.75, 0, 1)) ** 0.5 * gate
    spec = np.fft.rfft(np.random.default_rng(1).standard_normal(n))
    freqs = np.fft.rfftfreq(n, 1 / SR)
    spec[(freqs < 3000) | (freqs > 7000)] = 0
    hiss = np.fft.irfft(spec, n)
    sig += 0.045 * hiss / hiss.std() * ((pos > 0.8) & (pos < 0.92))
    return (0.5 * sig / np.abs(sig).max()).astype(np.float32)


def logspec(x: np.ndarray) -> np.ndarray:
    win = np.hanning(1024)
    frames = [np.abs(np.fft.rfft(win * x[i : i + 1024])) for i in range(0, len(x) - 1024, 256)]
    return 20 * np.log10(np.array(frames) + 1e-4)


def lsd(y: np.ndarray, ideal: np.ndarray) -> float:
    a, b = logspec(y), logspec(ideal)
    a = a[np.round(np.linspace(0, len(a) - 1, len(b))).astype(int)]
    loud = b.max(1) > b.max() - 40
    return float(np.sqrt(((a[loud] - b[loud]) ** 2).mean(1)).mean())


def f0_of(x: np.ndarray) -> float:
    out = []
    for i in range(0, len(x) - 960, 480):
        w = x[i : i + 960]
        if np.abs(w).max() < 0.2 * np.abs(x).max():
            continue
        ac = np.correlate(w, w, "full")[959:]
        lo, hi = SR // 400, SR // 70
        out.append(SR / (lo + np.argmax(ac[lo:hi])))
    return float(np.median(out))


def join_step(parts: list[np.ndarray]) -> float:
    y = np.concatenate(parts)
    ends = np.cumsum([len(p) for p in parts])[:-1]
    ends = ends[(ends > 0) & (ends < len(y))]
    d = np.abs(np.diff(y))
    return float(d[ends - 1].max() / np.delete(d, ends - 1).max())


Stream = Callable[[np.ndarray, float, int], list[np.ndarray]]


def pedalboard(x: np.ndarray, s: float) -> np.ndarray:
    import pedalboard as pb

    return pb.time_stretch(x[None], SR, stretch_factor=s)[0]


def librosa(x: np.ndarray, s: float) -> np.ndarray:
    import librosa as lr

    return lr.effects.time_stretch(x, rate=s)


def pytsmod(x: np.ndarray, s: float) -> np.ndarray:
    import pytsmod as tsm

    return tsm.wsola(x, 1 / s).astype(np.float32)


def signalsmith(x: np.ndarray, s: float) -> np.ndarray:
    from python_stretch import Signalsmith

    st = Signalsmith.Stretch()
    st.preset(1, SR)
    st.timeFactor = s
    return st.process(x[None])[0]


def audiotsm(kind: str) -> Stream:
    def run(x: np.ndarray, s: float, chunk: int) -> list[np.ndarray]:
        import audiotsm as at
        from audiotsm.io.array import ArrayReader, ArrayWriter

        tsm = at.wsola(1, speed=s) if kind == "wsola" else at.phasevocoder(1, s, 1024)
        parts = []
        for i in range(0, len(x), chunk):
            w = ArrayWriter(1)
            tsm.run(ArrayReader(x[None, i : i + chunk]), w, flush=False)
            parts.append(w.data[0])
        w = ArrayWriter(1)
        tsm.run(ArrayReader(np.zeros((1, 2048))), w, flush=True)
        return [*parts, w.data[0]]

    return run


def pylibrb(x: np.ndarray, s: float, chunk: int) -> list[np.ndarray]:
    from pylibrb import Option, RubberBandStretcher

    options = Option.PROCESS_REALTIME | Option.ENGINE_FINER
    st = RubberBandStretcher(SR, 1, options, initial_time_ratio=1 / s)
    st.set_max_process_size(max(chunk, st.get_preferred_start_pad()))

    def feed(b: np.ndarray, final: bool = False) -> np.ndarray:
        st.process(b[None].astype(np.float32), final)
        out = [st.retrieve_available()[0] for _ in iter(lambda: st.available() > 0, False)]
        return np.concatenate(out) if out else np.zeros(0, np.float32)

    delay = st.get_start_delay()
    parts = [feed(np.zeros(st.get_preferred_start_pad(), np.float32))]
    parts += [feed(x[i : i + chunk]) for i in range(0, len(x), chunk)]
    parts.append(feed(np.zeros(0, np.float32), True))
    y = np.concatenate(parts)  # the start delay and the tail past the length cut off
    cut = np.split(y[delay : delay + round(len(x) / s)], np.cumsum([len(p) for p in parts]))
    return [p for p in cut if p.size]


def omniflow(x: np.ndarray, s: float, chunk: int) -> list[np.ndarray]:
    st = TimeStretch(s, SR)
    return [st.push(x[i : i + chunk]) for i in range(0, len(x), chunk)] + [st.finish()]


def per_chunk(whole: Callable[[np.ndarray, float], np.ndarray]) -> Stream:
    return lambda x, s, chunk: [whole(x[i : i + chunk], s) for i in range(0, len(x), chunk)]


def streaming(stream: Stream, s: float) -> Callable[[np.ndarray, float], np.ndarray]:
    return lambda x, s: np.concatenate(stream(x, s, len(x)))[: round(len(x) / s)]


CANDIDATES: dict[str, tuple[Callable[[np.ndarray, float], np.ndarray] | None, Stream | None]] = {
    "pedalboard time_stretch (Rubber Band R3)": (pedalboard, per_chunk(pedalboard)),
    "librosa.effects.time_stretch (phase vocoder)": (librosa, per_chunk(librosa)),
    "pytsmod wsola": (pytsmod, None),
    "python-stretch (Signalsmith Stretch)": (signalsmith, per_chunk(signalsmith)),
    "pylibrb (Rubber Band, real-time mode)": (None, pylibrb),
    "audiotsm phasevocoder (1024)": (None, audiotsm("pv")),
    "audiotsm wsola (defaults)": (None, audiotsm("wsola")),
    "omniflow: audiotsm wsola 768/192, exact hops": (None, omniflow),
}


def main() -> None:
    x = speechlike(DUR)
    f0_in = f0_of(x)
    columns = "length | LSD dB | level | f0 | CPU ms/s | join step | stream-whole"
    rows = [f"| library | speed | {columns} |"]
    rows.append("|" + " --- |" * 9)
    for name, (whole, stream) in CANDIDATES.items():
        for s in SPEEDS:
            fn = whole or streaming(stream, s)
            fn(x, s)  # warm-up: imports, JIT
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                y = fn(x, s)
                times.append(time.perf_counter() - t0)
            y = y[: max(len(y), 1)]
            ideal = speechlike(DUR / s)
            cells = [
                name,
                f"{s}",
                f"{100 * (len(y) / (len(x) / s) - 1):+.1f} %",
                f"{lsd(y, ideal):.1f}",
                f"{np.sqrt((y**2).mean() / (x**2).mean()):.2f}",
                f"{f0_of(y) / f0_in:.3f}",
                f"{1000 * min(times) / DUR:.1f}",
            ]
            if stream is None:
                cells += ["no streaming API", ""]
            else:
                parts = stream(x, s, CHUNK)
                ys = np.concatenate(parts)
                n = min(len(ys), len(y))
                cells += [f"{join_step(parts):.2f}", f"{np.abs(ys[:n] - y[:n]).max():.3f}"]
            rows.append("| " + " | ".join(cells) + " |")
            print(rows[-1], flush=True)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
