"""Acceptance by position in the output, and whether a drafter is deterministic, from chunk streams.

A streamed chunk carries the tokens one engine step gave a request (docs/semantics.md §6): 1 plus
the accepted drafts. Read along a request's output, the chunks give the tokens per decode step as a
function of the output position. For n-gram and suffix drafting that curve is not flat: the
proposer matches the prompt and what was generated so far, so its acceptance changes as the output
grows (on the tiny test model, measured: the calibrated acceptance was 4% off at output 64 and 15%
at output 128 with one per-run value). Learned drafters (DSpark, EAGLE, MTP) keep dsim's
per-position-in-draft model; the output-position table is measured for any method and used by
`check` only where it was measured.

Deterministic drafting: with greedy decoding an n-gram proposer offers the same drafts for the same
prompt, and a deterministic target accepts the same ones: identical requests then get identical
chunk sequences (measured on the test server: every draft accepted, 37% of steps without one). The
acceptance file says so (``deterministic``), and `check` simulates it without per-request or
per-step acceptance noise (sigma_request = sigma_step = 0).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import numpy as np

from validator import measure

if TYPE_CHECKING:
    from collections.abc import Sequence

BUCKET_TOKENS = 16
DETERMINISTIC_SHARE = 0.9  # identical requests with the group's most common chunk sequence


def _decode_chunks(r: dict) -> list[int]:
    return [int(c[1]) for c in r.get("chunks") or [] if c[1] > 0]


def output_position_table(ms: Sequence[measure.Measurement], bucket: int = BUCKET_TOKENS) -> dict | None:
    """Mean tokens per decode step by output position (buckets of ``bucket`` tokens, position =
    tokens the request had before the step), over the requests with per-token timing. A request's
    last chunk is left out (max_tokens cuts it short). None without chunk streams."""
    sums: dict = {}
    for m in ms:
        for r in m.ok_requests:
            lat = measure.request_latencies(r)
            if lat is None or lat["burst"]:
                continue
            toks = _decode_chunks(r)
            pos = toks[0] if toks else 0
            for t in toks[1:-1]:
                b = pos // bucket
                s = sums.setdefault(b, [0.0, 0])
                s[0] += t
                s[1] += 1
                pos += t
    if not sums:
        return None
    top = max(sums)
    tps, steps = [], []
    last = None
    for b in range(top + 1):
        if b in sums and sums[b][1] > 0:
            last = sums[b][0] / sums[b][1]
        tps.append(round(float(last if last is not None else 1.0), 4))
        steps.append(int(sums.get(b, [0, 0])[1]))
    return {"bucket_tokens": bucket, "tokens_per_step": tps, "steps": steps}


def determinism(ms: Sequence[measure.Measurement]) -> dict | None:
    """Share of requests whose chunk sequence equals the most common one of their group (same
    prompt length and max_tokens: the replay sends the same prompt for the same length)."""
    groups: dict = {}
    for m in ms:
        for r in m.ok_requests:
            lat = measure.request_latencies(r)
            if lat is None or lat["burst"]:
                continue
            groups.setdefault((r.get("prompt_tokens"), r.get("max_tokens")), []).append(tuple(_decode_chunks(r)))
    same = total = 0
    for seqs in groups.values():
        if len(seqs) < 2:
            continue
        same += Counter(seqs).most_common(1)[0][1]
        total += len(seqs)
    if not total:
        return None
    share = same / total
    return {"identical_share": round(share, 4), "requests": total, "deterministic": share >= DETERMINISTIC_SHARE}


def tokens_per_step_over(table: dict, output_len: float) -> float:
    """Mean tokens per decode step of a request of ``output_len`` tokens, walking the table from
    the first decode step (positions past the table hold its last bucket)."""
    b, tps = table["bucket_tokens"], table["tokens_per_step"]
    pos, steps, n = 1.0, 0, float(output_len)
    if n <= 1:
        return 1.0
    while pos < n:
        t = tps[min(int(pos // b), len(tps) - 1)]
        pos += max(t, 1.0)
        steps += 1
    return (n - 1) / steps


def curve_for_output(curve: Sequence[float], table: dict, calibrated_len: float, target_len: float) -> list[float]:
    """The per-step acceptance curve for requests of ``target_len`` output tokens: the first
    position's probability scaled so that the expected accepted tokens per step change as the
    output-position table says between the calibrated and the target length (identity at the
    calibrated length); the later positions' conditionals are kept."""
    p = [float(x) for x in curve]
    if not p:
        return p
    tail = 1.0 + sum(float(np.prod(p[1 : j + 1])) for j in range(1, len(p)))
    acc_cal = p[0] * tail
    w_cal = tokens_per_step_over(table, calibrated_len) - 1.0
    w_tgt = tokens_per_step_over(table, target_len) - 1.0
    if w_cal <= 0 or tail <= 0:
        return p
    p[0] = float(min(max(acc_cal * w_tgt / w_cal / tail, 0.0), 1.0))
    return [round(x, 6) for x in p]
