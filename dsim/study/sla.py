"""The SLA grammar of `dsim plan --sla` and the per-request SLO of goodput: durations with units,
``parse_sla("p50=20ms,ttft_p99=2s,min_user_tok_s=40")`` -> list of :class:`SLO`,
``parse_request_slo("ttft=500ms,tpot=20ms")`` -> per-request SLO dict; InputError naming the term for
anything else.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from dsim.errors import InputError

METRICS = ("tpot", "ttft", "itl", "e2e")
METRIC_LABEL = {
    "tpot": "TPOT (P-token latency)",
    "ttft": "TTFT",
    "itl": "ITL",
    "e2e": "E2E latency",
    "min_user_tok_s": "per-user speed",
}


@dataclass(frozen=True)
class SLO:
    """One SLA term: metric's pct-th percentile <= target_ms, or mean per-user speed >= target."""

    metric: str  # tpot | ttft | itl | e2e | min_user_tok_s
    pct: float | None  # 0 < pct < 100 (None for min_user_tok_s)
    target: float  # ms for latencies, tok/s for min_user_tok_s
    text: str  # as written

    @property
    def key(self) -> str:
        if self.metric == "min_user_tok_s":
            return "min_user_tok_s"
        return f"{self.metric}_p{self.pct:g}"

    @property
    def unit(self) -> str:
        return "tok/s" if self.metric == "min_user_tok_s" else "ms"

    @property
    def is_min(self) -> bool:
        return self.metric == "min_user_tok_s"

    def limit(self, margin: float) -> float:
        """The value a simulation must reach to pass, safety margin included."""
        return self.target / (1.0 - margin) if self.is_min else self.target * (1.0 - margin)

    def ok(self, value: float | None, margin: float) -> bool:
        if value is None or not math.isfinite(value):
            return False
        return value >= self.limit(margin) if self.is_min else value <= self.limit(margin)

    def describe(self) -> str:
        if self.is_min:
            return f"mean per-user speed >= {self.target:g} tok/s"
        return f"P{self.pct:g} {self.metric.upper()} <= {_fmt_ms(self.target)}"


def _fmt_ms(ms: float) -> str:
    return f"{ms / 1000:g}s" if ms >= 1000 and ms % 100 == 0 else f"{ms:g}ms"


_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Z/]*)\s*$")


def parse_duration_ms(value: str, what: str) -> float:
    """'20ms' -> 20.0, '1.5s' -> 1500.0; a missing or unknown unit is an error."""
    m = _DURATION.match(value)
    if not m:
        raise InputError(f"{what}: {value!r} is not a duration (e.g. 20ms or 1.5s)")
    num, unit = float(m.group(1)), m.group(2).lower()
    if not unit:
        raise InputError(f"{what}: {value!r} has no unit (write ms or s, e.g. {m.group(1)}ms)")
    if unit not in ("ms", "s"):
        raise InputError(f"{what}: unknown unit {m.group(2)!r} in {value!r} (ms or s)")
    ms = num * (1000.0 if unit == "s" else 1.0)
    if not math.isfinite(ms):
        raise InputError(f"{what}: {value!r} is not a finite duration")
    if not ms > 0:
        raise InputError(f"{what}: {value!r} must be > 0")
    return ms


_TERM = re.compile(r"^(?:([a-z0-9]+)_)?p([0-9]+(?:\.[0-9]+)?)$")


def parse_sla(s: str) -> list[SLO]:
    """Parse ``[metric_]pNN=VALUE`` terms (metric tpot|ttft|itl|e2e, default tpot; VALUE with unit
    ms or s) and ``min_user_tok_s=VALUE``, comma separated. Raises InputError on bad input."""
    if s is None or not str(s).strip():
        raise InputError("--sla: empty SLA (expected e.g. 'p50=20ms' or 'tpot_p99=50ms,ttft_p90=2s')")
    out: list[SLO] = []
    seen = set()
    for raw in str(s).split(","):
        term = raw.strip()
        if not term:
            raise InputError(f"--sla: empty term in {s!r}")
        if "=" not in term:
            raise InputError(f"--sla: {term!r} is not NAME=VALUE (e.g. p50=20ms)")
        name, value = (x.strip() for x in term.split("=", 1))
        name = name.lower()
        if name in ("min_user_tok_s", "user_tok_s_min"):
            v = value.lower().removesuffix("tok/s").strip()
            try:
                target = float(v)
            except ValueError:
                raise InputError(f"--sla: min_user_tok_s: {value!r} is not a number of tokens/s") from None
            if not (target > 0 and math.isfinite(target)):
                raise InputError(f"--sla: min_user_tok_s: must be > 0, got {value!r}")
            slo = SLO("min_user_tok_s", None, target, term)
        else:
            m = _TERM.match(name)
            if not m:
                raise InputError(
                    f"--sla: {name!r}: expected [metric_]pNN (metric {', '.join(METRICS)}) or min_user_tok_s"
                )
            metric = m.group(1) or "tpot"
            if metric not in METRICS:
                raise InputError(
                    f"--sla: unknown metric {metric!r} in {term!r} (known: {', '.join(METRICS)}, min_user_tok_s)"
                )
            pct = float(m.group(2))
            if not (0 < pct < 100):
                raise InputError(f"--sla: percentile p{m.group(2)} in {term!r} is out of range (0 < NN < 100)")
            slo = SLO(metric, pct, parse_duration_ms(value, f"--sla: {name}"), term)
        if slo.key in seen:
            raise InputError(f"--sla: {slo.key} given twice in {s!r}")
        seen.add(slo.key)
        out.append(slo)
    return out


def parse_request_slo(s: str) -> dict:
    """Per-request SLOs for goodput: 'ttft=500ms,tpot=20ms,e2e=10s' ->
    {'ttft_ms': 500.0, 'tpot_ms': 20.0, 'e2e_ms': 10000.0}."""
    if s is None or not str(s).strip():
        raise InputError("--slo: empty (expected e.g. ttft=500ms,tpot=20ms,e2e=10s)")
    out = {}
    for raw in str(s).split(","):
        term = raw.strip()
        if "=" not in term:
            raise InputError(f"--slo: {term!r} is not METRIC=VALUE (e.g. ttft=500ms)")
        k, v = (x.strip() for x in term.split("=", 1))
        k = k.lower()
        if k not in ("ttft", "tpot", "e2e"):
            raise InputError(f"--slo: unknown metric {k!r} (ttft, tpot, e2e)")
        if f"{k}_ms" in out:
            raise InputError(f"--slo: {k} given twice")
        out[f"{k}_ms"] = parse_duration_ms(v, f"--slo: {k}")
    return out
