"""The step-cost fit of a CPU server's points (validator.steps.server_points): the terms (per-step
overhead, per token in dsim's coordinate, per request, per prompt in the step, per context token, the
prompt-token discount; the speculative machinery's per-step cost where runs with and without
speculation are fitted together), which of them the points identify, NNLS with pins, and the test
that sets a term inside the run-to-run noise to 0 (fit_cost); a weighted line with non-negative
parts (fit_line). The fitted profiles are validator.fitted_profile.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import ArrayLike


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
# Terms never set to 0 by the rounds' test (kept whenever the points identify them): the step's
# overhead, the price of a verify token and that of a prompt token (the discount is their
# difference). Every sweep runs both kinds of token; "the two cost the same" is a model choice,
# not the absence of a term, and a wrong one prices every verify token as a prompt token: on the
# CPU test server (2026-12-07) the discount's three rounds gave 4.9-11.9 ms per 1000 (inside
# Student's t at 2 degrees of freedom), set to 0 the per-token price fell from 0.030 to 0.019 ms
# and C=8 TPOT came out -10% (the 2026-12-06 campaigns, all with the discount at 0: -14..-20%).
# A discount that is 0 costs only its noise, a few percent of the token price.
PRICES = ("cpu_overhead_ms", "ms_per_token", "prefill_discount_ms_per_ktok")


def _nnls_terms(X: np.ndarray, y: np.ndarray, w: np.ndarray, keep: list[int]) -> np.ndarray:
    from scipy.optimize import nnls

    coef = np.zeros(X.shape[1])
    if len(y) and keep:
        sol, _ = nnls((X * w[:, None])[:, keep], y * w)
        coef[keep] = sol
    return coef


def _ols_terms(X: np.ndarray, y: np.ndarray, w: np.ndarray, keep: list[int]) -> np.ndarray:
    """The same weighted fit without the bound 0 (a term may come out negative)."""
    coef = np.zeros(X.shape[1])
    if len(y) and keep:
        sol, *_ = np.linalg.lstsq((X * w[:, None])[:, keep], y * w, rcond=None)
        coef[keep] = sol
    return coef


def _spread(rounds: list, pinned: dict | None, keep: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(each round's estimates, rows of NNLS; each term's standard error over the NNLS rounds; the
    same error where the rounds' unbounded estimates move more). The last is what an interval
    states: where a term sits at the bound 0 in every round, the NNLS rounds agree exactly (an
    interval 0-0) although the unbounded estimates move from round to round, and that noise is
    what the rounds can tell the term from (on the CPU test server the per-request term sat at 0
    in all three rounds of one call and came out 0.003-0.14 ms in the next identical call). The
    fit's choices (which terms are 0 within the noise) stay on the NNLS rounds' error."""
    data = [_weights(r, pinned) for r in rounds if r]
    per = np.array([_nnls_terms(*d, keep) for d in data])
    free = np.array([_ols_terms(*d, keep) for d in data])
    se = per.std(axis=0, ddof=1) / np.sqrt(len(per))
    return per, se, np.maximum(se, free.std(axis=0, ddof=1) / np.sqrt(len(per)))


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
    if len([r for r in rounds or [] if r]) >= MIN_ROUNDS:
        free = [j for j in keep if ALL_TERMS[j] not in PRICES]
        while True:
            per, se, se_stated = _spread(rounds or [], pinned, keep)
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
                # (the prices count too: a term whose removal moves the per-token price beyond its
                # noise is not 0, another term would take its work)
                moved = [i for i in keep if i != cand and abs(wo[i] - coef[i]) > crit * max(se[i], 1e-12)]
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
                "upper": round(float(coef[drop] + crit * se_stated[drop]), 5),
            }
            warnings.append(
                f"{ALL_TERMS[drop]}: {coef[drop]:.3g} pooled, but its {len(per)} rounds gave {per[:, drop].min():.3g}-"
                f"{per[:, drop].max():.3g} (standard error {se[drop]:.3g}, under {crit:.2f} of them): not told from 0, set to 0 "
                f"(at most {coef[drop] + crit * se_stated[drop]:.3g} within the noise) - "
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
    if len([r for r in rounds or [] if r]) < MIN_ROUNDS:
        return {}
    per, _, se = _spread(rounds or [], pinned, keep)
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
