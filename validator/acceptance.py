"""Acceptance by position in the output, and whether a drafter is deterministic, from chunk streams.

A streamed chunk carries the tokens one engine step gave a request (docs/user/semantics.md §6): 1 plus
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
acceptance file says so (``deterministic``) and carries the sequence itself as a draft script
(``draft_script``: drafts verified and accepted at each decode step of a request); `check` gives it
to dsim's engine (EngineConfig.draft_script), so the simulated requests draft what the real ones
did at the same step: identical requests stay in lockstep and finish in the same step, and steps
without a draft verify nothing (on the test server the first 7 decode steps had no draft and cost
8-16 ms, the drafted ones 12-36 ms, at 1-8 requests). Without a script (a drafter that is not
deterministic) `check` draws acceptance without per-request or per-step noise.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import numpy as np

from validator import measure

if TYPE_CHECKING:
    from collections.abc import Sequence

BUCKET_TOKENS = 16
DETERMINISTIC_SHARE = 0.9  # requests consistent with their group's reference chunk sequence


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


def _chunk_sequences(ms: Sequence[measure.Measurement]) -> dict:
    """(prompt tokens, max_tokens) -> the decode chunk sequences of the successful requests of
    that group (requests whose stream came in a burst are left out)."""
    groups: dict = {}
    for m in ms:
        for r in m.ok_requests:
            lat = measure.request_latencies(r)
            if lat is None or lat["burst"]:
                continue
            groups.setdefault((r.get("prompt_tokens"), r.get("max_tokens")), []).append(tuple(_decode_chunks(r)))
    return groups


def _boundaries(seq: tuple) -> frozenset:
    return frozenset(np.cumsum(seq).tolist())


def coarsens(seq: tuple, ref: tuple) -> bool:
    """Whether chunk sequence ``seq`` is ``ref`` with some neighbouring chunks merged: the same
    tokens, its chunk boundaries a subset of ref's. The front end merges the outputs of two engine
    steps into one chunk when it falls behind (a 2 in a run of 1s: two undrafted steps streamed
    together), which never splits one; measured on the test server: in one C=8 run 16 of 24
    requests had one such merged pair in their first 8 decode steps and were otherwise identical."""
    return sum(seq) == sum(ref) and _boundaries(seq) <= _boundaries(ref)


def reference_sequence(seqs: Sequence[tuple]) -> tuple[tuple, int]:
    """The group's engine chunk sequence, the most common one (ties: the finer), and how many of
    ``seqs`` are consistent with it: equal to it or a coarsening of it (``coarsens``), once at least
    two requests streamed it exactly (a sequence seen once is no evidence of what the engine ran).
    (Not the sequence the most requests coarsen: one token per step refines every sequence.)"""
    counts = Counter(seqs)
    ref = max(counts, key=lambda q: (counts[q], len(q)))
    if counts[ref] < 2:
        return ref, counts[ref]
    return ref, sum(c for q, c in counts.items() if coarsens(q, ref))


def determinism(ms: Sequence[measure.Measurement]) -> dict | None:
    """Share of requests whose chunk sequence is their group's reference sequence up to chunks the
    front end merged (``reference_sequence``; a group: same prompt length and max_tokens, the
    replay sends the same prompt for the same length), and the share strictly identical to it."""
    groups = _chunk_sequences(ms)
    same = ident = total = 0
    for seqs in groups.values():
        if len(seqs) < 2:
            continue
        ref, n = reference_sequence(seqs)
        same += n
        ident += sum(1 for s in seqs if s == ref)
        total += len(seqs)
    if not total:
        return None
    share = same / total
    return {
        "identical_share": round(ident / total, 4),
        "consistent_share": round(share, 4),
        "requests": total,
        "deterministic": share >= DETERMINISTIC_SHARE,
    }


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


def draft_script(ms: Sequence[measure.Measurement], k: int, per_request: dict | None = None) -> list[list[int]] | None:
    """[[verified, accepted], ...] per decode step of a request, from the reference chunk sequence
    (``reference_sequence``) of the deterministic group with the longest output (the replay sends one prompt per
    length): accepted = tokens of the step's chunk - 1 (at most k). Which steps drafted and how
    many drafts each verified come from vLLM's counters per request (``per_request``: drafts,
    draft_tokens, accepted): a step that accepted something drafted; of the one-token steps,
    only as many drafted (and were all rejected) as the drafts counter has left, spread evenly;
    a drafted step verified its accepted drafts plus the counters' share of rejected ones (with
    every draft accepted, as on the test server, exactly its accepted ones: the proposer offered
    no more than matched). The first chunk (the prefill's token) and the last (cut by max_tokens)
    are left out. None without a deterministic group of three or more decode steps."""
    groups = _chunk_sequences(ms)
    best = None
    for (_, mt), seqs in groups.items():
        seq, n = reference_sequence(seqs)
        if len(seqs) < 2 or n / len(seqs) < DETERMINISTIC_SHARE or len(seq) < 4:
            continue
        if best is None or (mt or 0) > best[0]:
            best = (mt or 0, seq)
    if best is None or k <= 0:
        return None
    steps = [min(max(int(e) - 1, 0), k) for e in best[1][1:-1]]
    acc = np.array(steps, dtype=np.int64)
    drafted = acc > 0
    pr = per_request or {}
    d_left = float(pr.get("drafts", 0.0)) - float(drafted.sum() + (best[1][-1] > 1))
    ones = np.flatnonzero(~drafted)
    if d_left >= 0.5 and len(ones):
        n_rej = min(int(round(d_left)), len(ones))
        drafted[ones[np.linspace(0, len(ones) - 1, n_rej).round().astype(int)]] = True
    dt, a = float(pr.get("draft_tokens", 0.0)), float(pr.get("accepted", 0.0))
    n_d = float(pr.get("drafts", 0.0))
    share = (dt - a) / (n_d * k - a) if pr and n_d * k - a > 1e-9 else (0.0 if pr else 1.0)
    share = min(max(share, 0.0), 1.0)
    ver = np.where(drafted, acc + np.round(share * (k - acc)).astype(np.int64), 0)
    return [[int(v), int(x)] for v, x in zip(ver, acc)]


def run_script(m: measure.Measurement, k: int) -> list[list[int]] | None:
    """One run's draft script from its own chunk streams and vLLM's counters (its summary's spec
    counters per completed request), when its drafter was deterministic; None otherwise (or
    without speculation or counters)."""
    spec = m.stats().get("spec") or {}
    n = len(m.ok_requests)
    det = determinism([m])
    if not k or not n or "num_drafts" not in spec or not det or not det.get("deterministic"):
        return None
    per = {
        "drafts": spec["num_drafts"] / n,
        "draft_tokens": spec["num_draft_tokens"] / n,
        "accepted": spec["num_accepted_tokens"] / n,
    }
    return draft_script([m], k, per)
