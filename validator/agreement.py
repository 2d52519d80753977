"""Do several profile-server calls agree? Each fitted term's 95% intervals (stepfit's, over the
call's rounds) compared pair by pair, and the overhead also as its share of each call's mean
step (profile_server.overhead_share), the split without the machine's level.

Why the share: a call's intervals hold the noise within its rounds, tens of seconds apart. The
speed of a shared host moves more between calls minutes apart (the sweep's mean step 5.3-6.3 ms
over five identical calls on a 2-core VM), and every term in ms moves with it; the share of the
step does not. ``compare-profiles`` prints both, and the level's own change, so that a user can
tell a changed server from a host that got slower.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from dsim.errors import InputError
from validator import stepfit


def interval(fit: dict, term: str) -> tuple[float, float] | None:
    """A term's 95% interval in one call: its rounds' interval; [0, its upper bound] for a term
    0 within the rounds' noise; (v, v) for a pinned term; None without rounds (one round, a
    profile made before intervals, a term not identified)."""
    if term in (fit.get("pinned") or {}):
        v = float(fit["pinned"][term])
        return (v, v)
    z = (fit.get("zero_within_noise") or {}).get(term)
    if z is not None:
        return (0.0, float(z.get("upper", 0.0)))
    iv = (fit.get("intervals") or {}).get(term)
    return None if iv is None else (float(iv["low"]), float(iv["high"]))


def _overlapping(ivs: Sequence[tuple[float, float] | None]) -> tuple[int, int]:
    """(pairs whose intervals overlap, pairs with both intervals)."""
    pairs = [(a, b) for a, b in itertools.combinations(ivs, 2) if a is not None and b is not None]
    return sum(1 for a, b in pairs if a[0] <= b[1] and b[0] <= a[1]), len(pairs)


def agreement(fits: Sequence[dict]) -> dict:
    """Pairwise agreement of several calls' fits (``validator.fit`` of each profile):
    ``terms`` {term: {"intervals", "values", "overlapping", "pairs"}} for every term some call
    has an interval for; ``overhead_share`` the same for the overhead's share of each call's mean
    step, with ``mean_step_ms`` per call and ``level_change`` ((max - min) / min of those), where
    every call has it; ``agree`` whether every compared pair overlaps, the overhead judged by
    its share where there is one."""
    if len(fits) < 2:
        raise InputError(f"compare-profiles: needs two profiles or more, got {len(fits)}")
    terms: dict = {}
    for t in stepfit.ALL_TERMS:
        ivs = [interval(f, t) for f in fits]
        if all(iv is None for iv in ivs):
            continue
        ok, n = _overlapping(ivs)
        terms[t] = {
            "intervals": ivs,
            "values": [float(f.get(t, 0.0)) for f in fits],
            "overlapping": ok,
            "pairs": n,
        }
    out: dict = {"calls": len(fits), "terms": terms}
    shares: list[dict] = [s for f in fits if (s := f.get("overhead_share"))]
    if len(shares) == len(fits):
        steps = [float(s["mean_step_ms"]) for s in shares]
        ok, n = _overlapping([(float(s["low"]), float(s["high"])) for s in shares])
        out["overhead_share"] = {
            "values": [float(s["value"]) for s in shares],
            "intervals": [(float(s["low"]), float(s["high"])) for s in shares],
            "mean_step_ms": steps,
            "level_change": round((max(steps) - min(steps)) / min(steps), 4),
            "overlapping": ok,
            "pairs": n,
        }
    judged = [v for t, v in terms.items() if not (t == "cpu_overhead_ms" and "overhead_share" in out)]
    if "overhead_share" in out:
        judged.append(out["overhead_share"])
    out["agree"] = all(v["overlapping"] == v["pairs"] for v in judged)
    return out


def lines(a: dict, names: Sequence[str]) -> list[str]:
    """What compare-profiles prints: the level, then each term's agreement."""
    out = [f"{a['calls']} profiles: {', '.join(names)}"]
    sh = a.get("overhead_share")
    if sh:
        steps = sh["mean_step_ms"]
        out.append(
            f"the sweep's mean step: {', '.join(f'{s:.3g}' for s in steps)} ms (the machine's level; "
            f"{sh['level_change']:.0%} apart)"
        )
    for t, v in a["terms"].items():
        ivs = ", ".join("-" if iv is None else f"{iv[0]:.4g}-{iv[1]:.4g}" for iv in v["intervals"])
        note = " (carries the level: judged by its share below)" if t == "cpu_overhead_ms" and sh else ""
        out.append(f"  {t}: {v['overlapping']}/{v['pairs']} pairs of intervals overlap ({ivs}){note}")
    if sh:
        ivs = ", ".join(f"{lo:.1%}-{hi:.1%}" for lo, hi in sh["intervals"])
        out.append(f"  overhead's share of the mean step: {sh['overlapping']}/{sh['pairs']} pairs overlap ({ivs})")
    out.append(
        "agree: every term's intervals overlap"
        if a["agree"]
        else "DISAGREE: some intervals do not overlap (the server, its flags or the host changed between calls)"
    )
    return out
