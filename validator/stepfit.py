"""Engine step times from a replay's chunk timelines, and profile tables fitted to them.

A streamed chunk arrives once per engine step per request (docs/user/semantics.md §6), so the gap between two
chunks of one request is one step (or a few, when the front end coalesced outputs). For each gap
we count the requests in flight at its midpoint (sent, not finished): the running batch B. The
median gap per B is the step time at that batch (medians drop the steps that also ran a prefill).

Coordinates. dsim schedules ``1 + K`` tokens per decoding request per step (a method with K drafts
drafts every step), so the tables written here are in dsim's coordinate ``n = B x (1 + K)``: the
time dsim must charge for a step that it will see as n tokens. (A real ngram proposer drafts only
when it finds a match; the acceptance file folds the steps without drafts into p1, see
calibrate.py, so the emitted tokens per step match as well.)
"""

from __future__ import annotations

import datetime as _dt
from typing import TYPE_CHECKING, Any

import numpy as np

from dsim.cost import Profile, Table, profile_from_dict

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

    from validator.measure import Measurement

GRID = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
# draft tables are read as a staircase (next profiled size at or above): every request count
REQ_GRID = list(range(1, 257)) + [512, 1024, 2048, 4096, 8192]


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


TERMS = (
    "cpu_overhead_ms",
    "ms_per_token",
    "ms_per_request",
    "ms_per_prefill",
    "kv_ms_per_ktok",
    "prefill_discount_ms_per_ktok",
)
# The speculative machinery's own cost per step (the proposer and the rejection sampler of a
# speculative server, whatever its batch): a column of 1 for the points of a server that
# speculated, 0 for one that did not. A speculative server's points alone cannot tell it from the
# step overhead (both are 1 in every step); runs of the server with and without speculation fitted
# together can. It is asked only of such a mix (fit_cost), and priced where dsim prices a method's
# drafting: the emulating method's draft table (linear_profile), which a simulation without
# speculation does not pay. (On the CPU test server a speculative calibration's overhead was 3.6 ms
# against a measured 2.8-3.0 ms step without speculation: no-speculation TPOT came out +28-37%.)
SPEC_TERM = "spec_step_ms"
ALL_TERMS = TERMS + (SPEC_TERM,)
# What to measure when a term cannot be told apart from the others (profile-server --shape).
_HOW = {
    "ms_per_token": "vary the tokens per step at a fixed number of requests (e.g. --shape 256:16, a longer prompt)",
    "ms_per_request": "vary the requests per step at fixed tokens (several concurrencies and a longer prompt)",
    "ms_per_prefill": "points whose steps carry prompts and points whose steps do not (prefill and decode points)",
    "kv_ms_per_ktok": "vary the context at a fixed batch, much (e.g. --shape 384:64@4, a long prompt at four requests)",
    "cpu_overhead_ms": "points at more than one step size",
    "prefill_discount_ms_per_ktok": "prompts of another length than the calibration's (e.g. --shape 256:16) next to "
    "decode points",
    SPEC_TERM: "runs of the same server with speculative decoding and without, fitted together",
}
COLLINEAR = 0.05  # a term whose column is within 5% of the others' span is not identified
# ... unless rounds measure its noise: then only a column within 1% of the others' span (nearly a
# combination of them, where NNLS splits their work at random) is left out by the gate, and the
# rounds' test of 0 decides the rest (fit_cost)
COLLINEAR_ROUNDS = 0.01
# Which of several terms that do not stand apart leaves first: the prompt-token discount refines the
# per-token term (it prices a prompt token against a verify token) and the per-prompt term the
# prefill's, so when prompt tokens and verify tokens move together (a drafter whose verify tokens
# per request never vary) the discount goes and prompt tokens are priced as verify tokens, rather
# than the per-token term going and every token coming out free (the live CPU profile's two
# columns stood 0.055 apart, either side of the threshold from run to run).
DROP_ORDER = (
    SPEC_TERM,
    "prefill_discount_ms_per_ktok",
    "ms_per_prefill",
    "kv_ms_per_ktok",
    "ms_per_request",
    "ms_per_token",
    "cpu_overhead_ms",
)


def _columns(points: list[dict]) -> np.ndarray:
    return np.array(
        [
            [
                1.0,
                p["n"],
                p["b"],
                p.get("prefills", 0.0) or 0.0,
                p.get("kv", 0.0) / 1000.0,
                -(p.get("prompt_tokens", 0.0) or 0.0) / 1000.0,
                float(p.get("spec", 0.0) or 0.0),
            ]
            for p in points
        ],
        dtype=float,
    )


def identifiable(X: np.ndarray, keep: list[int], j: int) -> float:
    """How far column j of X stands apart from the kept others: the norm of its residual after
    least squares on them, relative to its own norm (0: a combination of them; 1: orthogonal)."""
    col = X[:, j]
    nrm = float(np.linalg.norm(col))
    if nrm == 0:
        return 0.0
    others = [i for i in keep if i != j]
    if not others:
        return 1.0
    A = X[:, others]
    coef, *_ = np.linalg.lstsq(A, col, rcond=None)
    return float(np.linalg.norm(col - A @ coef) / nrm)


NOISE_LEVEL = 0.95  # a term is told from 0 when 0 is outside this two-sided confidence interval


def noise_t(rounds: int) -> float:
    """How many standard errors a term must be from 0 to be told from it, with its standard error
    estimated from ``rounds`` repeats: Student's t at rounds - 1 degrees of freedom (2.78 for 5
    rounds, 4.30 for 3), not the normal 2.0, which is the limit of many rounds and, with 5, passes
    a term that is 0 about one time in eight."""
    from scipy.stats import t

    return float(t.ppf(0.5 + NOISE_LEVEL / 2, max(rounds - 1, 1)))


MIN_ROUNDS = 3  # repeats needed to measure a term's standard error


def _nnls_terms(X: np.ndarray, y: np.ndarray, w: np.ndarray, keep: list[int]) -> np.ndarray:
    from scipy.optimize import nnls

    coef = np.zeros(X.shape[1])
    if len(y) and keep:
        sol, _ = nnls((X * w[:, None])[:, keep], y * w)
        coef[keep] = sol
    return coef


def _weights(points: list[dict], pinned: dict | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(columns, step times less the pinned terms' part, relative weights of the step times)."""
    X = _columns(points)
    y = np.array([p["step_ms"] for p in points])
    w = np.array([p.get("weight", 1.0) for p in points]) / np.maximum(y, 1e-9)
    if pinned:
        y = y - X @ _pin_vector(pinned)
    return X, y, w


def _pin_vector(pinned: dict) -> np.ndarray:
    v = np.zeros(len(ALL_TERMS))
    for t, x in pinned.items():
        v[ALL_TERMS.index(t)] = float(x)
    return v


def parse_pins(specs: list[str] | None) -> dict:
    """``TERM=VALUE`` options (profile-server --pin) -> {term: value}: a term held at a value the
    fit does not move (a known cost, or 0), instead of one the points do not identify flipping
    between calls."""
    from dsim.errors import InputError

    out: dict = {}
    for spec in specs or []:
        name, _, val = str(spec).partition("=")
        name = name.strip()
        if name not in ALL_TERMS:
            raise InputError(f"--pin: unknown term {name!r} (one of: {', '.join(ALL_TERMS)})")
        try:
            x = float(val)
        except ValueError:
            raise InputError(f"--pin: {name}: a number, got {val!r}") from None
        if not (np.isfinite(x) and x >= 0):
            raise InputError(f"--pin: {name}: a finite number >= 0, got {val!r}")
        out[name] = x
    return out


def fit_cost(
    points: list[dict],
    terms: tuple | None = None,
    rounds: list | None = None,
    confounding: bool = True,
    pinned: dict | None = None,
) -> dict:
    """Non-negative least squares of step_ms = c + t n + d b + e prefills + kv x context/1000 -
    disc x prompt tokens/1000 over the points (relative errors): c per-step CPU overhead, t per
    scheduled token (forward, priced as a decode/verify token), d per sampling request (ngram
    proposal, rejection sampling: CPU work per request), e per prompt in the step (work that does
    not scale with its tokens: on the CPU test server a prefill step tracked its prompts more than
    its tokens), kv per thousand context tokens read, disc what a prompt token costs less than a
    decode/verify token per thousand (dsim's prefill_terms.discount_ms_per_ktok; at most t: on the
    CPU test server a verify token cost 3x a prompt token). A term the points cannot tell apart from the others (its column within 5% of
    their span: e.g. a concurrency sweep at one shape raises tokens and requests together) is
    left out (0) with a warning saying what to measure; ``determined`` is true when all the
    asked terms were identified. Residuals per point are in ``residuals`` (relative).

    ``rounds``: the same points measured in each of several repeats (one list per round, as the
    held-out collection's interleaved rounds give). Each round is fitted on its own with the
    identified terms; a term whose pooled estimate is less than noise_t(rounds) standard errors of its
    round estimates (their standard deviation / sqrt(rounds)) cannot be told from 0 on a machine
    whose speed moves this much between runs: it is set to 0 (``zero_within_noise``, with a
    warning giving its rounds' range) and the others refitted. Its column stood apart, so the fit
    stays determined: the term was measured, and it is 0 within the noise. (On the CPU test server
    the context term came out 0-12 ms per 1000 tokens over one collection's rounds, its pooled 2-3
    ms inside the noise, and priced the long shape's steps 10-15% high.) A term inside the noise is
    kept when leaving it out moves another kept term beyond that term's own noise
    (``kept_confounded``, warned): the other term would take its work.

    ``terms`` default: TERMS, and SPEC_TERM when the points mix a speculative server's (``spec`` 1)
    with one's that did not speculate (mixed_speculation). ``pinned`` {term: value}: terms held at
    those values (their part taken off the step times before the fit, in every round too); listed
    in ``pinned``, neither identified nor not."""
    pinned = dict(pinned or {})
    if terms is None:
        terms = TERMS + ((SPEC_TERM,) if mixed_speculation(points) else ())
    terms = tuple(t for t in terms if t not in pinned)
    X, y, w = _weights(points, pinned)
    y_obs = y + X @ _pin_vector(pinned) if pinned else y
    Xw = X * w[:, None]
    want = [ALL_TERMS.index(t) for t in terms]
    keep = list(want)
    warnings, separation = [], {}
    # drop terms that do not stand apart, one at a time, until the rest do: a column the points
    # never fill first, then the refinements before what they refine (DROP_ORDER)
    # with rounds, a column in the band [COLLINEAR_ROUNDS, COLLINEAR) stays for the rounds' test of 0
    # below to decide: its separation moves either side of COLLINEAR from one call to the next (the
    # live CPU profile's request column), and a term the gate dropped in one call and the noise test
    # in the other, or kept at the bound 0 in one, made two identical calls disagree on the term set
    with_rounds = len([r for r in rounds or [] if r]) >= MIN_ROUNDS
    gate = COLLINEAR_ROUNDS if with_rounds else COLLINEAR
    while len(keep) > 1:
        sep = {j: identifiable(Xw, keep, j) for j in keep}
        separation.update({ALL_TERMS[i]: round(v, 4) for i, v in sep.items()})
        below = [i for i in keep if sep[i] < gate]
        if not below or len(points) <= 1:
            break
        empty = [i for i in below if not np.any(Xw[:, i])]
        j = empty[0] if empty else min(below, key=lambda i: DROP_ORDER.index(ALL_TERMS[i]))
        keep.remove(j)
        warnings.append(
            f"{ALL_TERMS[j]}: not identified by these points (separation {sep[j]:.3f} < {gate}); "
            f"left at 0 - {_HOW[ALL_TERMS[j]]}"
        )
    if len(points) < len(keep):
        warnings.append(f"{len(points)} point(s) for {len(keep)} terms: the fit is underdetermined")
    coef = _nnls_terms(X, y, w, keep)
    noise: dict = {}
    confounded: dict = {}
    if rounds and len(rounds) >= MIN_ROUNDS:
        free = [j for j in keep if ALL_TERMS[j] not in ("cpu_overhead_ms", "ms_per_token")]
        while True:
            per = np.array([_nnls_terms(*_weights(r, pinned), keep) for r in rounds if r])
            if len(per) < MIN_ROUNDS:
                break
            se = per.std(axis=0, ddof=1) / np.sqrt(len(per))
            crit = noise_t(len(per))
            # a term whose interval reaches 0 (at the bound 0 included) is 0 within the noise
            weak = [j for j in free if j in keep and coef[j] <= crit * se[j]]
            weak.sort(key=lambda i: coef[i] / max(se[i], 1e-12))
            drop: int | None = None
            without = coef
            for cand in weak:
                # a term is 0 within the noise only if leaving it out moves no other kept term
                # beyond that term's own noise: otherwise another term takes its work (on the CPU
                # test server the context term took the prompt-token discount's: 2.1-2.9 ms per
                # 1000 tokens over three rounds with it, 4.3 without it, and the long shape's
                # decode steps carrying prompts came out 30-40% dear)
                wo = _nnls_terms(X, y, w, [i for i in keep if i != cand])
                moved = [i for i in free if i in keep and i != cand and abs(wo[i] - coef[i]) > crit * max(se[i], 1e-12)]
                # (a column the gate alone would have left out is not kept this way: 0 within
                # the noise every time, not kept in one call and dropped in the next)
                if moved and confounding and separation.get(ALL_TERMS[cand], 1.0) >= COLLINEAR:
                    confounded.setdefault(ALL_TERMS[cand], sorted(ALL_TERMS[i] for i in moved))
                    continue
                drop, without = cand, wo
                break
            if drop is None:
                break
            confounded.pop(ALL_TERMS[drop], None)
            noise[ALL_TERMS[drop]] = {
                "pooled": round(float(coef[drop]), 4),
                "rounds": [round(float(v), 4) for v in per[:, drop]],
                "standard_error": round(float(se[drop]), 4),
                "t_critical": round(crit, 3),
                # what the noise allows: the top of its interval (pooled + t standard errors)
                "upper": round(float(coef[drop] + crit * se[drop]), 5),
            }
            warnings.append(
                f"{ALL_TERMS[drop]}: {coef[drop]:.3g} pooled, but its {len(per)} rounds gave {per[:, drop].min():.3g}-"
                f"{per[:, drop].max():.3g} (standard error {se[drop]:.3g}, under {crit:.2f} of them): not told from 0, set to 0 "
                f"(at most {coef[drop] + crit * se[drop]:.3g} within the noise) - "
                f"{_HOW[ALL_TERMS[drop]]}"
            )
            keep.remove(drop)
            coef = without
    for name, others in confounded.items():
        if ALL_TERMS.index(name) in keep:
            warnings.append(
                f"{name}: inside its rounds' noise, but kept: leaving it out moves {', '.join(others)} beyond "
                "their own noise (they would take its work) - " + _HOW[name]
            )
    for j in keep:
        if coef[j] == 0.0 and ALL_TERMS[j] != "cpu_overhead_ms":
            warnings.append(f"{ALL_TERMS[j]}: fitted at 0 (the bound): the points do not show it")
    for t, x in pinned.items():
        coef[ALL_TERMS.index(t)] = float(x)
    di, ti = ALL_TERMS.index("prefill_discount_ms_per_ktok"), ALL_TERMS.index("ms_per_token")
    if coef[di] > 1000.0 * coef[ti] + 1e-12:
        warnings.append(
            f"prefill_discount_ms_per_ktok: fitted {coef[di]:.4g}, more than a token costs "
            f"({1000.0 * coef[ti]:.4g} per 1000): held at that (prompt tokens free)"
        )
        coef[di] = 1000.0 * coef[ti]
    fit: dict[str, Any] = {t: float(coef[i]) for i, t in enumerate(ALL_TERMS)}
    fit["intervals"] = _intervals(coef, rounds, keep, pinned)
    fit["pinned"] = pinned
    pred = X @ coef
    rank = int(np.linalg.matrix_rank(Xw[:, want])) if len(X) else 0
    fit.update(
        {
            "rank": rank,
            "identified": [ALL_TERMS[j] for j in keep],
            "not_identified": [ALL_TERMS[j] for j in want if j not in keep and ALL_TERMS[j] not in noise],
            "zero_within_noise": noise,
            "kept_confounded": confounded,
            "separation": separation,
            "determined": len(keep) + len(noise) == len(want) and len(points) >= len(want),
            "residuals": [round(float((a - b) / b), 4) if b else None for a, b in zip(pred, y_obs)],
            "warnings": warnings,
        }
    )
    return fit


def _intervals(coef: np.ndarray, rounds: list | None, keep: list[int], pinned: dict | None = None) -> dict:
    """Each kept term's confidence interval at NOISE_LEVEL from the rounds fitted apart (the pooled
    value +- noise_t(rounds) standard errors of the rounds' values; the lower end at the bound 0),
    with the rounds' values: {term: {"low", "high", "rounds"}}; {} with fewer than MIN_ROUNDS."""
    if not rounds or len(rounds) < MIN_ROUNDS:
        return {}
    per = np.array([_nnls_terms(*_weights(r, pinned), keep) for r in rounds if r])
    if len(per) < MIN_ROUNDS:
        return {}
    se = per.std(axis=0, ddof=1) / np.sqrt(len(per))
    crit = noise_t(len(per))
    return {
        ALL_TERMS[j]: {
            "low": round(float(max(coef[j] - crit * se[j], 0.0)), 5),
            "high": round(float(coef[j] + crit * se[j]), 5),
            "rounds": [round(float(v), 5) for v in per[:, j]],
        }
        for j in keep
    }


def mixed_speculation(points: list[dict]) -> bool:
    """Whether the points hold steps of a speculative server and of one that did not speculate."""
    flags = {bool(p.get("spec")) for p in points}
    return flags == {True, False}


def fit_line(x: ArrayLike, y: ArrayLike, w: ArrayLike | None = None) -> tuple[float, float]:
    """Weighted least squares y = a + b x with b >= 0, a >= 0; one point: a = 0 (all slope)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    w = np.ones_like(x) if w is None else np.asarray(w, float)
    if len(x) == 0:
        raise ValueError("no points")
    if len(np.unique(x)) < 2:
        return 0.0, float(np.average(y / x, weights=w))
    sw = np.sqrt(w)
    A = np.stack([np.ones_like(x), x], axis=1) * sw[:, None]
    (a, b), *_ = np.linalg.lstsq(A, y * sw, rcond=None)
    if b < 0:
        a, b = float(np.average(y, weights=w)), 0.0
    if a < 0:
        a, b = 0.0, float(np.sum(w * x * y) / np.sum(w * x * x))
    return float(a), float(b)


def linear_profile(
    name: str,
    kind: str,
    fit: dict,
    provenance: dict,
    kv_cache_gib: float = 1.0,
    kv_bytes_per_token: float = 1024.0,
    extra: dict | None = None,
) -> Profile:
    """A CPU profile: no CUDA graphs (capture_sizes [1]); forward(n) = ms_per_token x n; the
    per-request CPU work of speculation (ngram proposal, rejection sampling) goes to the draft
    table of the emulating method (block) keyed by sampling requests, with the speculative
    machinery's per-step cost (SPEC_TERM) as its constant; cpu_overhead_ms per step."""
    t, d = fit["ms_per_token"], fit["ms_per_request"]
    spec = float(fit.get(SPEC_TERM) or 0.0)  # per step of a speculative server: in the draft table
    return _cpu_profile(
        name,
        kind,
        provenance,
        kv_cache_gib,
        kv_bytes_per_token,
        float(fit["cpu_overhead_ms"]),
        GRID,
        [t * n for n in GRID],
        REQ_GRID,
        [spec + d * n for n in REQ_GRID],
        extra,
        kv_ms_per_ktok=float(fit.get("kv_ms_per_ktok") or 0.0),
        prefill_ms_per_chunk=float(fit.get("ms_per_prefill") or 0.0),
        prefill_discount_ms_per_ktok=float(fit.get("prefill_discount_ms_per_ktok") or 0.0),
    )


def _cpu_profile(
    name,
    kind,
    provenance,
    kv_cache_gib,
    kv_bytes_per_token,
    cpu_overhead_ms,
    tokens,
    ms,
    draft_requests,
    draft_ms,
    extra,
    kv_ms_per_ktok: float = 0.0,
    prefill_ms_per_chunk: float = 0.0,
    prefill_discount_ms_per_ktok: float = 0.0,
) -> Profile:
    """A profile of a CPU server (no CUDA graphs: capture_sizes [1]), its provenance completed with
    dsim's required fields, and the emulating method's draft table."""
    known = ("hardware", "model", "engine", "engine_version", "date", "method")
    d_ = {
        "name": name,
        "provenance": {
            "kind": kind,
            "hardware": provenance.get("hardware", "unknown"),
            "gpus_per_replica": 1,
            "model": provenance.get("model", "unknown"),
            "engine": provenance.get("engine", "vllm"),
            "engine_version": provenance.get("engine_version"),
            "date": provenance.get("date") or _dt.date.today().isoformat(),
            "method": provenance.get("method", ""),
            **{k: v for k, v in provenance.items() if k not in known},
        },
        "memory": {"kv_cache_gib": float(kv_cache_gib), "kv_bytes_per_token": float(kv_bytes_per_token)},
        "cpu_overhead_ms": round(float(cpu_overhead_ms), 5),
        "capture_sizes": [1],
        "forward": {"tokens": list(tokens), "ms": [round(float(v), 5) for v in ms]},
        "kv_ms_per_ktok": round(float(kv_ms_per_ktok), 6),
        "draft": {"block": {"requests": list(draft_requests), "ms": [round(float(v), 5) for v in draft_ms]}},
    }
    if prefill_ms_per_chunk or prefill_discount_ms_per_ktok:
        d_["prefill_terms"] = {
            "ms_per_chunk": round(float(prefill_ms_per_chunk), 5),
            "discount_ms_per_ktok": round(float(prefill_discount_ms_per_ktok), 5),
        }
    if extra:
        d_.update(extra)
    return profile_from_dict(d_, f"<{name}>")


def zero_block_draft(p: Profile) -> Profile:
    """The profile with a zero-cost draft table for 'block' (ngram emulation), if it has none."""
    import dataclasses

    if "block" in p.draft:
        return p
    draft = dict(p.draft)
    draft["block"] = Table(np.array([1.0, 2.0]), np.array([0.0, 0.0]))
    return dataclasses.replace(p, draft=draft)


def measured_profile(
    name: str,
    points: list[dict],
    fit: dict,
    provenance: dict,
    k: int,
    kv_cache_gib: float = 1.0,
    kv_bytes_per_token: float = 1024.0,
    extra: dict | None = None,
) -> Profile:
    """A CPU profile whose forward table runs through the measured decode points.

    Step time is not linear in the batch on CPU (it flattens as Python overhead is shared), so a
    global fit misses between and beyond its points; here forward(n) at n = B (1 + K) is the
    measured decode step minus cpu_overhead_ms, linear between points, last slope beyond (dsim's
    rule above the capture limit, capture_sizes [1]). Below the first point the fitted per-token
    slope goes down to n = 1. A prefill point is kept only where it extends the table upwards.
    What the fit identified apart from the tokens comes out of the points first: the per-request
    work goes to the emulating method's draft table (``d`` x sampling requests), the context term
    to ``kv_ms_per_ktok``; terms the fit could not identify stay 0, their work stays in the points
    (so the table is right at the swept compositions and wrong away from them, as warned).
    """
    c = float(fit["cpu_overhead_ms"])
    d = float(fit.get("ms_per_request") or 0.0)
    e = float(fit.get("ms_per_prefill") or 0.0)
    kv = float(fit.get("kv_ms_per_ktok") or 0.0) / 1000.0
    disc = float(fit.get("prefill_discount_ms_per_ktok") or 0.0) / 1000.0
    sp = float(fit.get(SPEC_TERM) or 0.0)
    dec = sorted((p for p in points if p["kind"].startswith("decode")), key=lambda p: p["n"])
    if not dec:
        raise ValueError("no decode points")
    c = min(c, 0.9 * min(p["step_ms"] for p in dec))

    def own(p: dict) -> float:
        # the point's forward part, its tokens priced as decode tokens: step minus overhead,
        # requests, prompts and context, plus what its prompt tokens cost less
        return max(
            p["step_ms"]
            - c
            - d * p["b"]
            - e * (p.get("prefills") or 0.0)
            - kv * p.get("kv", 0.0)
            - sp * (p.get("spec") or 0.0)
            + disc * (p.get("prompt_tokens") or 0.0),
            0.0,
        )

    acc: dict = {}
    for p in dec:
        acc.setdefault(max(int(round(p["n"])), 1), []).append(own(p))
    table = {n: float(np.mean(v)) for n, v in acc.items()}
    for p in sorted(points, key=lambda p: p["n"]):
        n = int(round(p["n"]))
        if p["kind"] == "prefill" and n > max(table) and own(p) >= table[max(table)]:
            table[n] = own(p)
    xs = sorted(table)
    slope = fit["ms_per_token"] + (0.0 if d else fit["ms_per_request"] / (1 + k))
    if xs[0] > 1:
        table[1] = max(table[xs[0]] - slope * (xs[0] - 1), 0.0)
    xs = sorted(table)
    ms = np.maximum.accumulate([table[x] for x in xs])
    # dsim prices a prompt token as the table's token minus the discount: the discount can be at
    # most what the table charges a token, at every size and past its end (dsim.cost checks both)
    cap = min(float(np.min(ms / np.asarray(xs, float))), (ms[-1] - ms[-2]) / (xs[-1] - xs[-2]) if len(xs) > 1 else 0.0)
    if disc > cap:
        fit.setdefault("warnings", []).append(
            f"prefill_discount_ms_per_ktok: {disc * 1000:.4g} held at {max(cap, 0.0) * 1000:.4g}, what the "
            "forward table charges a token at its cheapest"
        )
        disc = max(0.999 * cap, 0.0)  # (below it after the rounding of the profile file)
    return _cpu_profile(
        name,
        "measured",
        provenance,
        kv_cache_gib,
        kv_bytes_per_token,
        c,
        xs,
        ms,
        REQ_GRID,
        [sp + d * r for r in REQ_GRID],
        extra,
        kv_ms_per_ktok=kv * 1000.0,
        prefill_ms_per_chunk=e,
        prefill_discount_ms_per_ktok=disc * 1000.0,
    )
