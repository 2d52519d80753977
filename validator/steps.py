"""Engine step times from a replay's chunk timelines, and the step-cost points of a measurement.

A streamed chunk arrives once per engine step per request (docs/user/semantics.md §6), so the gap between two
chunks of one request is one step (or a few, when the front end coalesced outputs). For each gap
we count the requests in flight at its midpoint (sent, not finished): the running batch B. The
median gap per B is the step time at that batch (medians drop the steps that also ran a prefill).

Coordinates. dsim schedules ``1 + K`` tokens per decoding request per step (a method with K drafts
drafts every step), so the points (and the tables fitted to them) are in dsim's coordinate ``n = B x (1 + K)``: the
time dsim must charge for a step that it will see as n tokens. (A real ngram proposer drafts only
when it finds a match; the acceptance file folds the steps without drafts into p1, see
calibrate.py, so the emitted tokens per step match as well.)

The points (server_points: each server histogram's mean placed at the mean composition of the steps
it sampled) are fitted by validator.stepfit; the profiles are written by validator.fitted_profile.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from validator.measure import Measurement


def step_points(m: Measurement, min_gaps: int = 5) -> list[dict]:
    """[{batch, step_ms (median gap), gaps, p25, p75}] from one measurement's ok requests."""
    reqs = [r for r in m.requests if r.get("ok") and r.get("chunks") and r.get("send_s") is not None]
    if not reqs:
        return []
    starts = np.array([r["send_s"] for r in reqs])
    ends = np.array([r["end_s"] for r in reqs])
    by_b: dict[int, list] = {}
    for r in reqs:
        times = [c[0] for c in r["chunks"] if c[1] > 0]
        for a, b in zip(times, times[1:]):
            mid = 0.5 * (a + b)
            batch = int(np.sum((starts <= mid) & (ends >= mid)))
            by_b.setdefault(batch, []).append((b - a) * 1e3)
    out = []
    for b, gaps in sorted(by_b.items()):
        if len(gaps) < min_gaps or b < 1:
            continue
        g = np.asarray(gaps)
        out.append(
            {
                "batch": b,
                "step_ms": float(np.median(g)),
                "gaps": int(len(g)),
                "p25": float(np.percentile(g, 25)),
                "p75": float(np.percentile(g, 75)),
            }
        )
    return out


def chunk_steps(tokens: list[int], script: list | None) -> list[int]:
    """The decode step (1-based; 0: the prefill's chunk) whose output each chunk of a request ends
    with, walking the draft script ([verified, accepted] per decode step, its last entry repeated
    past its end): the front end merges the outputs of consecutive steps into one chunk when it
    falls behind, so a chunk can hold several steps' tokens and the chunk index then runs behind
    the step. Without a script, or where the tokens do not follow it, the chunk index."""
    out = list(range(len(tokens)))
    if not script or not tokens:
        return out
    step, j = 0, 1
    for c in tokens[1:]:
        left = int(c)
        while left > 0:
            step += 1
            left -= 1 + int(script[min(step - 1, len(script) - 1)][1])
        if left < 0 and j < len(tokens) - 1:  # not the script's tokens (the last chunk may be cut
            return out  # short by max_tokens): keep the chunk index from here on
        out[j] = step
        j += 1
    return out


def _merge_split_steps(cands: list[list], max_gap_s: float) -> list[list]:
    """Join the parts of one engine step that the front end streamed apart. vLLM schedules every
    running request in every step (nothing is preempted here), so a request that was already
    decoding and streams a chunk in a group that none of the previous group's requests are in
    belongs to that previous group's step: two consecutive steps share every request decoding in
    both. Measured at C=8 on the test server: one request's chunk 2-10 ms ahead of the other
    seven's in a quarter of the steps (the API server's CPU is shared with the client), which made
    a 40-token step look like a 5-token and a 35-token one and biased the decode points' mean
    composition low (the server's own step count, vllm:iteration_tokens_total, agrees with the
    joined steps). A group is joined to the previous one only when it holds no first token (a
    prompt scheduled later than the others is a step of its own), shares no request with it, and
    starts less than ``max_gap_s`` after it."""
    out: list[list] = []
    for c in cands:
        if out:
            prev = out[-1]
            ids = {e[1] for e in prev}
            if not any(e[2] for e in c) and not ids & {e[1] for e in c} and c[0][0] - prev[-1][0] < max_gap_s:
                out[-1] = prev + c
                continue
        out.append(list(c))
    return out


def _inflight_at(reqs, t) -> int:
    return sum(1 for r in reqs if r["send_s"] < t < r["end_s"])


def engine_steps(
    m: Measurement,
    gap_frac: float = 0.3,
    min_gap_ms: float = 0.2,
    max_gap_ms: float = 2.0,
    k: int = 0,
    script: list | None = None,
    merge_split: bool = True,
    merge_frac: float = 0.5,
) -> list[dict] | None:
    """The engine steps of a replay, reconstructed from the client's chunk times: one engine step
    streams one chunk to every request it scheduled, so the chunks of one step reach the client
    within a fraction of a millisecond and consecutive steps are a step time apart. Chunks closer
    than ``gap_frac`` x the median chunk gap of a request (clamped to [min_gap_ms, max_gap_ms])
    form one step; a request seen twice in one group (two steps delivered together by a stalled
    front end) splits it. Per step: ``t`` (s), ``prefills`` (requests whose first token it
    produced), ``prompt_tokens`` (the prompt tokens it computed: the prompts less what they read
    from the server's prefix cache, validator.prefix.cached_tokens), ``cached_tokens`` (those
    read), ``decodes`` (requests it gave later tokens),
    ``decode_tokens`` (the tokens the decodes ran: 1 + the drafts each verified, from ``script``
    (acceptance.draft_script: [verified, accepted] per decode step of a request) at the request's
    decode step when given, else 1 + k each). Only the composition is used (durations come from the server's histograms), so front-end delay
    and jitter do not bias it. None without chunk timelines."""
    from validator import prefix

    per_decode = 1 + k  # (k is reused below)
    cached = prefix.cached_tokens(m)
    ev = []
    gaps = []
    for r in m.ok_requests:
        times = [c[0] for c in r.get("chunks") or [] if c[1] > 0]
        if not times:
            continue
        gaps += [b - a for a, b in zip(times, times[1:])]
        prompt = int(r.get("prompt_tokens") or 0)
        hit = float(cached.get(r["i"], 0.0))
        # context the step reads for this request: its prompt (cached part included) plus the
        # tokens it had before
        toks = [int(c[1]) for c in r["chunks"] if c[1] > 0]
        emitted = np.concatenate([[0], np.cumsum(toks)[:-1]])
        at = chunk_steps(toks, script)
        ev += [(t, r["i"], j == 0, prompt, prompt + int(emitted[j]), at[j], hit) for j, t in enumerate(times)]
    if not ev:
        return None
    med = float(np.median(gaps)) * 1e3 if gaps else max_gap_ms / gap_frac
    thr = min(max(gap_frac * med, min_gap_ms), max_gap_ms) / 1e3
    ev.sort()
    groups, cur = [], [ev[0]]
    for e in ev[1:]:
        if e[0] - cur[-1][0] > thr:
            groups.append(cur)
            cur = [e]
        else:
            cur.append(e)
    groups.append(cur)
    cands = []
    for g in groups:
        seen: dict = {}
        subs: list = []
        for e in g:  # the k-th chunk of a request in the group belongs to sub-step k
            k = seen.get(e[1], 0)
            seen[e[1]] = k + 1
            if k == len(subs):
                subs.append([])
            subs[k].append(e)
        cands += subs
    if merge_split:
        cands = _merge_split_steps(cands, merge_frac * med / 1e3)
    steps = []
    for sub in cands:
        pre = [e for e in sub if e[2]]
        dec = [e for e in sub if not e[2]]
        if script:
            dtok = sum(1 + int(script[min(e[5] - 1, len(script) - 1)][0]) for e in dec)
        else:
            dtok = len(dec) * per_decode
        steps.append(
            {
                "t": sub[0][0],
                "prefills": len(pre),
                "prompt_tokens": sum(e[3] - e[6] for e in pre),
                "cached_tokens": sum(e[6] for e in pre),
                "decodes": len(dec),
                "decode_tokens": dtok,
                "context": sum(e[4] for e in sub),
            }
        )
    return steps


def _composition_points(m, k: int, itl: dict, pre: dict) -> list[dict] | None:
    """Decode and prefill points placed at the mean composition of the steps the server's ITL and
    prefill histograms sampled (engine_steps): an ITL sample is one decoding request in a step, a
    prefill sample one prompt in a step, and either step may also carry the other kind of work
    (closed-loop requests start in waves: several prompts share a step). Under a step cost linear
    in the tokens and requests of the step, the histogram mean is the cost at these mean
    coordinates: n = prompt tokens + the decodes' tokens (1 + the drafts each verified: from the
    run's own draft script when its drafter was deterministic, else 1 + K), b = requests in the
    step.

    With a draft script the decode samples are split into two points, steps whose decodes drafted
    and steps whose decodes did not (an n-gram proposer without a match: one token per request):
    the two differ in tokens at the same requests, which is what tells a verify token's cost from a
    request's. The server's ITL mean is shared between them in the ratio of the client's mean
    chunk gaps of the two kinds (the composition and that ratio from the client, the level from the
    engine); the weighted mean of the two points is the histogram's mean."""
    script = run_script(m, k)
    steps = engine_steps(m, k=k, script=script)
    if not steps:
        return None
    pts = []
    for kind, w_key, hist in (("decode", "decodes", itl), ("prefill", "prefills", pre)):
        if not hist.get("mean"):
            continue
        w = np.array([s[w_key] for s in steps], dtype=float)
        if w.sum() <= 0:
            continue
        classes = [("", np.ones(len(steps), bool), hist["mean"] * 1e3)]
        if kind == "decode" and script:
            split = _draft_split(m, script, steps, w, hist["mean"] * 1e3)
            if split:
                classes = split
        for suffix, sel, step_ms in classes:
            ww = np.where(sel, w, 0.0)
            pts.append(
                dict(
                    _mean_composition(steps, ww),
                    kind=kind + suffix,
                    step_ms=step_ms,
                    weight=float(ww.sum() / w.sum()) ** 0.5 if suffix else 1.0,
                    samples=hist.get("count"),
                )
            )
    return pts


def _mean_composition(steps: list[dict], w: np.ndarray) -> dict:
    n = np.array([s["prompt_tokens"] + s["decode_tokens"] for s in steps], dtype=float)
    b = np.array([s["prefills"] + s["decodes"] for s in steps], dtype=float)
    bbar = float(np.average(b, weights=w))
    return {
        "batch": bbar,
        "n": float(np.average(n, weights=w)),
        "b": bbar,
        "prompt_tokens": float(np.average([s["prompt_tokens"] for s in steps], weights=w)),
        "prefills": float(np.average([s["prefills"] for s in steps], weights=w)),
        "kv": float(np.average([s["context"] for s in steps], weights=w)),
        "prefill_share": float(np.average([s["prefills"] > 0 for s in steps], weights=w)),
    }


MIN_SPLIT_SHARE = 0.1  # each kind of decode step holds at least this share of the ITL samples
MIN_SPLIT_GAPS = 5


def _draft_split(m, script: list, steps: list[dict], w: np.ndarray, mean_ms: float) -> list | None:
    """[(suffix, step mask, step_ms)] for the drafted and the undrafted decode steps, or None when
    one kind is too rare to place. A step is drafted when its decodes verified drafts; a chunk gap
    (one step of one request, per-token-timed requests only) is drafted by the request's own
    script entry (the same thing in lockstep, where all requests are at one decode step)."""
    drafted = np.array([s["decode_tokens"] > s["decodes"] for s in steps])
    share = float(w[drafted].sum() / w.sum())
    if not MIN_SPLIT_SHARE <= share <= 1 - MIN_SPLIT_SHARE:
        return None
    from validator import measure

    gaps: dict = {True: [], False: []}
    for r in m.ok_requests:
        lat = measure.request_latencies(r)
        if lat is None or lat["burst"]:
            continue
        t = [c[0] for c in r.get("chunks") or [] if c[1] > 0]
        at = chunk_steps([int(c[1]) for c in r.get("chunks") or [] if c[1] > 0], script)
        for j in range(1, len(t) - 1):  # (the last step is cut by max_tokens)
            if at[j] - at[j - 1] == 1:  # one step (a merged chunk's gap spans several)
                gaps[int(script[min(at[j] - 1, len(script) - 1)][0]) > 0].append(t[j] - t[j - 1])
    if min(len(gaps[True]), len(gaps[False])) < MIN_SPLIT_GAPS:
        return None
    rho = float(np.mean(gaps[True]) / np.mean(gaps[False]))
    # mean = (1 - share) m_nd + share m_dr, m_dr = rho m_nd
    m_nd = mean_ms / ((1 - share) + share * rho)
    return [("-drafted", drafted, rho * m_nd), ("-undrafted", ~drafted, m_nd)]


def run_script(m: Measurement, k: int) -> list | None:
    """The run's own draft script (validator.acceptance.run_script)."""
    from validator import acceptance

    return acceptance.run_script(m, k)


def server_points(m: Measurement, k: int) -> list[dict]:
    """_server_points, each point flagged ``spec`` (1.0: the server speculated, K = k > 0; the
    column of SPEC_TERM)."""
    return [dict(p, spec=1.0 if k else 0.0) for p in _server_points(m, k)]


def _server_points(m: Measurement, k: int) -> list[dict]:
    """Step-time points from the server's own histograms (robust to a CPU-starved client/front end):

    - decode: mean ITL (one sample per request per step), prefill: mean request_prefill_time (the
      step that ran the prompt), each at the mean composition of the steps it sampled, from the
      client's chunk times (_composition_points): n = prompt tokens + decodes (1 + K), b = requests;
    - without chunk timelines: decode at the mean running batch B (n = B (1 + K)), prefill at
      n = prompt + B_o (1 + K), B_o = requests already in flight when it was sent.
    Falls back to the client per-batch medians (step_points) without server histograms.
    """
    s = m.stats()
    h = s.get("server_histograms") or {}
    itl = h.get("vllm:inter_token_latency_seconds") or {}
    pre = h.get("vllm:request_prefill_time_seconds") or {}
    ok = [r for r in m.ok_requests if r.get("send_s") is not None and r.get("end_s") is not None]
    pts = []
    if itl.get("mean") and ok:
        comp = _composition_points(m, k, itl, pre)
        if comp:
            return comp
        bs = []
        for r in ok:
            times = [c[0] for c in r.get("chunks") or [] if c[1] > 0]
            bs += [_inflight_at(ok, 0.5 * (a + b)) for a, b in zip(times, times[1:])]
        bbar = float(np.mean(bs)) if bs else 1.0
        pts.append(
            {
                "kind": "decode",
                "batch": bbar,
                "n": bbar * (1 + k),
                "b": bbar,
                "step_ms": itl["mean"] * 1e3,
                "weight": 1.0,
                "samples": itl.get("count"),
            }
        )
        if pre.get("mean"):
            bo = float(np.mean([_inflight_at(ok, r["send_s"]) for r in ok]))
            pbar = float(np.mean([r["prompt_tokens"] for r in ok]))
            pts.append(
                {
                    "kind": "prefill",
                    "batch": bo + 1,
                    "n": pbar + bo * (1 + k),
                    "b": bo + 1,
                    "prompt_tokens": pbar,
                    "prefills": 1.0,
                    "step_ms": pre["mean"] * 1e3,
                    "weight": 1.0,
                    "samples": pre.get("count"),
                }
            )
        return pts
    for p in step_points(m):
        pts.append(
            {
                "kind": "decode-client",
                "batch": p["batch"],
                "n": p["batch"] * (1 + k),
                "b": p["batch"],
                "step_ms": p["step_ms"],
                "weight": float(p["gaps"]) ** 0.5,
                "samples": p["gaps"],
            }
        )
    return pts
