"""The workload itself: a ``Workload`` is one row per request, sorted by arrival, first arrival at
0 s (see docs/dev/architecture.md, "Workload"), with what was done to it recorded (``changes``);
slicing it (``head``, ``time_window``, ``scale_rate``) and class mixes (``parse_mix``,
``assign_classes``). Reading and writing trace files: dsim.workload.readers; synthetic workloads:
dsim.workload.synthesis."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from dsim.errors import InputError

#: Class mix assumed for traces that carry no class (except Azure code -> all "code").
DEFAULT_MIX: dict[str, float] = {"chat": 0.6, "code": 0.2, "math": 0.2}
#: Canonical class order used when a native trace names classes.
DEFAULT_CLASSES: tuple[str, ...] = ("math", "code", "chat")
MOONCAKE_BLOCK_TOKENS = 512
RATE_SCALE_RANGE = (0.1, 100.0)

# --------------------------------------------------------------------------------------------
# The Workload
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Workload:
    """One row per request, sorted by arrival; see docs/dev/architecture.md ("Workload")."""

    arrival_s: np.ndarray  # float64, seconds from the first arrival (0 for the first)
    prompt_tokens: np.ndarray  # int64 > 0
    output_tokens: np.ndarray  # int64 > 0
    cls: np.ndarray  # int16, index into class_names
    class_names: tuple[str, ...]
    session_id: np.ndarray  # int64, -1 when unknown
    prefix_hashes: list[np.ndarray] | None = None  # per request int64 block hashes
    prefix_block_tokens: int = MOONCAKE_BLOCK_TOKENS
    closed_loop_concurrency: int | None = None
    # A closed loop measured as several runs back to back (a benchmark's repeats, pooled): the
    # indices where a run starts after the first. A run's users start together once every request
    # of the run before has finished, as each measured run began with its whole first wave.
    closed_loop_run_starts: tuple[int, ...] = ()
    source: str = ""  # where it came from and everything done to it, in words
    class_mix_assumed: bool = False
    rows: np.ndarray | None = None  # int64, each request's data row in the trace file (0-based)
    locator: Callable[[int], str] | None = None  # data row -> "path:line" (for error messages)
    trace_name: str = ""  # what a title calls it: the trace's name, its file's name, "synthetic"
    changes: tuple[str, ...] = ()  # what was done to it, in order ("first 150 requests", "rate x20")

    def __post_init__(self):
        n = len(self.arrival_s)
        if n == 0:
            raise InputError(f"{self.source or 'workload'}: empty workload (no requests)")
        if self.rows is not None and len(self.rows) != n:
            raise ValueError(f"Workload.rows has {len(self.rows)} rows, expected {n}")
        for name in ("prompt_tokens", "output_tokens", "cls", "session_id"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"Workload.{name} has {len(getattr(self, name))} rows, expected {n}")
        if self.prefix_hashes is not None and len(self.prefix_hashes) != n:
            raise ValueError("Workload.prefix_hashes length differs from the number of requests")
        # own, typed, read-only copies (the caller's arrays are left alone)
        for name, dt in (
            ("arrival_s", np.float64),
            ("prompt_tokens", np.int64),
            ("output_tokens", np.int64),
            ("cls", np.int16),
            ("session_id", np.int64),
        ):
            a = np.array(getattr(self, name), dtype=dt)
            a.setflags(write=False)
            object.__setattr__(self, name, a)
        object.__setattr__(self, "class_names", tuple(self.class_names))
        if self.arrival_s[0] != 0.0 or (n > 1 and np.any(np.diff(self.arrival_s) < 0)):
            raise ValueError("Workload.arrival_s must be sorted and start at 0")
        if np.any(self.prompt_tokens <= 0) or np.any(self.output_tokens <= 0):
            raise ValueError("Workload token counts must be > 0")
        if np.any(self.cls < 0) or np.any(self.cls >= len(self.class_names)):
            raise ValueError("Workload.cls out of range of class_names")
        if self.closed_loop_concurrency is not None and self.closed_loop_concurrency < 1:
            raise ValueError("closed_loop_concurrency must be >= 1")
        starts = tuple(int(i) for i in self.closed_loop_run_starts)
        object.__setattr__(self, "closed_loop_run_starts", starts)
        if starts and (
            self.closed_loop_concurrency is None or starts[0] < 1 or starts[-1] >= n or any(np.diff(starts) < 1)
        ):
            raise ValueError("closed_loop_run_starts: increasing request indices in [1, n) of a closed loop")

    # -- basic views -------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def n_requests(self) -> int:
        return len(self.arrival_s)

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1])

    @property
    def class_labels(self) -> np.ndarray:
        """Class name per request (object array)."""
        return np.asarray(self.class_names, dtype=object)[self.cls]

    def where(self, i: int) -> str:
        """Where request i came from: ``path:line`` (``path:row N`` for Parquet) of its trace
        row, or ``request N`` (1-based) for a generated workload."""
        if self.locator is not None and self.rows is not None:
            return self.locator(int(self.rows[i]))
        return f"request {int(i) + 1}"

    def describe(self) -> dict:
        """Shape summary (rates, length means/percentiles, class shares)."""
        n = len(self)
        gaps = np.diff(self.arrival_s)
        out = {
            "requests": n,
            "duration_s": self.duration_s,
            "rate_per_s": (n - 1) / self.duration_s if self.duration_s > 0 else float("nan"),
            "interarrival_cv": float(gaps.std() / gaps.mean()) if n > 2 and gaps.mean() > 0 else float("nan"),
            "prompt_mean": float(self.prompt_tokens.mean()),
            "prompt_p50": float(np.percentile(self.prompt_tokens, 50)),
            "prompt_p99": float(np.percentile(self.prompt_tokens, 99)),
            "output_mean": float(self.output_tokens.mean()),
            "output_p50": float(np.percentile(self.output_tokens, 50)),
            "output_p99": float(np.percentile(self.output_tokens, 99)),
            "class_share": {c: float(np.mean(self.cls == i)) for i, c in enumerate(self.class_names)},
            "class_mix_assumed": self.class_mix_assumed,
            "closed_loop_concurrency": self.closed_loop_concurrency,
            "source": self.source,
        }
        return out

    # -- slicing (thin wrappers over the module functions) -----------------------------------
    def head(self, n: int) -> Workload:
        return head(self, n)

    def window(self, t0: float, t1: float) -> Workload:
        return time_window(self, t0, t1)

    def scale_rate(self, x: float) -> Workload:
        return scale_rate(self, x)

    def with_classes(self, mix: Any, seed: int = 0) -> Workload:
        return assign_classes(self, mix, seed)

    def changed(self, change: str, *, detail: str = "", **fields: Any) -> Workload:
        """This workload with `fields` replaced and `change` recorded (in `changes` and, with
        `detail` appended, in `source`)."""
        return dataclasses.replace(
            self, source=f"{self.source}; {change}{detail}", changes=(*self.changes, change), **fields
        )


def _take(w: Workload, idx: np.ndarray, *, rezero: bool, change: str) -> Workload:
    arr = np.asarray(w.arrival_s[idx], dtype=np.float64)
    if len(arr) == 0:
        raise InputError(f"{w.source}; {change}: empty workload (no requests selected)")
    if rezero:
        arr = arr - arr[0]
    return w.changed(
        change,
        arrival_s=arr,
        prompt_tokens=np.array(w.prompt_tokens[idx]),
        output_tokens=np.array(w.output_tokens[idx]),
        cls=np.array(w.cls[idx]),
        session_id=np.array(w.session_id[idx]),
        prefix_hashes=None if w.prefix_hashes is None else [w.prefix_hashes[i] for i in np.arange(len(w))[idx]],
        rows=None if w.rows is None else np.array(w.rows[idx]),
        # (a leading slice keeps the runs it reaches; any other selection is one run)
        closed_loop_run_starts=tuple(i for i in w.closed_loop_run_starts if i < len(arr))
        if isinstance(idx, slice) and not idx.start
        else (),
    )


def head(w: Workload, n: int) -> Workload:
    """The first ``n`` requests (by arrival)."""
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
        raise InputError(f"head: n must be an integer >= 1, got {n!r}")
    n = int(min(n, len(w)))
    return _take(w, slice(0, n), rezero=False, change=f"first {n} requests")


def time_window(w: Workload, t0: float, t1: float) -> Workload:
    """Requests arriving in [t0, t1) seconds; arrivals re-zeroed so the first is at 0."""
    if w.closed_loop_concurrency is not None:
        raise InputError("time window: a closed-loop workload has no arrival times")
    try:
        t0, t1 = float(t0), float(t1)
    except (TypeError, ValueError):
        raise InputError(f"time window: t0 and t1 must be numbers, got {t0!r}, {t1!r}") from None
    if not (math.isfinite(t0) and t0 >= 0 and t1 > t0):
        raise InputError(f"time window: need 0 <= t0 < t1, got [{t0}, {t1})")
    lo, hi = np.searchsorted(w.arrival_s, [t0, t1], side="left")
    if hi <= lo:
        raise InputError(f"time window [{t0:g}, {t1:g}) s holds no requests ({w.source})")
    return _take(w, slice(lo, hi), rezero=True, change=f"window [{t0:g}, {t1:g}) s")


def scale_rate(w: Workload, x: float) -> Workload:
    """Arrival rate times ``x`` (arrival times divided by x); 0.1 <= x <= 100."""
    lo, hi = RATE_SCALE_RANGE
    try:
        x = float(x)
    except (TypeError, ValueError):
        raise InputError(f"rate scale: not a number: {x!r}") from None
    if not (lo <= x <= hi):
        raise InputError(f"rate scale: {x:g} is out of range [{lo:g}, {hi:g}]")
    if w.closed_loop_concurrency is not None:
        raise InputError("rate scale: a closed-loop workload has no arrival rate (set the concurrency)")
    return w.changed(f"rate x{x:g}", arrival_s=w.arrival_s / x)


# --------------------------------------------------------------------------------------------
# Class mixes
# --------------------------------------------------------------------------------------------


def _fmt_mix(mix: Mapping[str, float]) -> str:
    return ",".join(f"{k}={v:g}" for k, v in mix.items())


def parse_mix(spec: Any) -> dict[str, float]:
    """Parse ``"math=0.3,code=0.2,chat=0.5"`` (or check a dict). Shares must sum to 1 (1e-6)."""
    if isinstance(spec, Mapping):
        items = [(str(k), v) for k, v in spec.items()]
    elif isinstance(spec, str):
        items = []
        parts = [p.strip() for p in spec.split(",")]
        if not spec.strip():
            raise InputError("mix: empty mix string (expected e.g. 'math=0.3,code=0.2,chat=0.5')")
        for p in parts:
            if "=" not in p:
                raise InputError(f"mix: {p!r} is not NAME=SHARE (in {spec!r})")
            k, v = p.split("=", 1)
            items.append((k.strip(), v.strip()))
    else:
        raise InputError(f"mix: expected a string like 'math=0.3,chat=0.7' or a dict, got {spec!r}")
    out: dict[str, float] = {}
    for k, v in items:
        if not k or not all(c.isalnum() or c in "_-." for c in k):
            raise InputError(f"mix: bad class name {k!r}")
        if k in out:
            raise InputError(f"mix: class {k!r} given twice")
        try:
            f = float(v)
        except (TypeError, ValueError):
            raise InputError(f"mix: {k}: share {v!r} is not a number") from None
        if not math.isfinite(f) or f < 0:
            raise InputError(f"mix: {k}: share {v!r} must be a finite number >= 0")
        out[k] = f
    if not out:
        raise InputError("mix: no classes given")
    total = sum(out.values())
    if abs(total - 1.0) > 1e-6:
        raise InputError(f"mix: shares sum to {total:.9g}, not 1 ({_fmt_mix(out)})")
    return out


def _mix_classes(n: int, mix: Mapping[str, float], seed: int) -> np.ndarray:
    """Exactly proportional class labels (largest remainder), in a seeded random order."""
    p = np.array(list(mix.values()), dtype=np.float64)
    raw = p * n
    counts = np.floor(raw).astype(np.int64)
    rest = n - counts.sum()
    if rest > 0:
        order = np.argsort(-(raw - counts), kind="stable")
        counts[order[:rest]] += 1
    labels = np.repeat(np.arange(len(p), dtype=np.int16), counts)
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x6D6978]))
    return labels[rng.permutation(n)].astype(np.int16)


def assign_classes(w: Workload, mix: Any, seed: int = 0) -> Workload:
    """Assign classes by a mix (exact shares up to rounding, seeded order); flags it assumed."""
    mix = parse_mix(mix)
    cls = _mix_classes(len(w), mix, seed)
    return w.changed(
        f"classes assumed: mix {_fmt_mix(mix)}",
        detail=f" seed={seed}",
        cls=cls,
        class_names=tuple(mix),
        class_mix_assumed=True,
    )
