"""The GPU profiler's step model (torch-free): a step shape's terms and attention features, the
relative least-squares fit of the forward table, KV slope, prefill and attention terms
(fit_step_model), the forward table, and the prediction of a step from a profile with dsim's own
cost model (predicted_step_ms: dsim.cost.CostModel).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from dsim.cost import CostModel, profile_from_dict
from validator.gpu.plan import FIT_EXCLUDE, PREFILL_MIN_Q, SLOPE_ONLY, StepShape, median


def step_terms(q: Sequence[int], ctx: Sequence[int]) -> tuple[int, float]:
    """(decode/verify tokens, prefill query-key pairs / 1e6) of a step shape: requests with fewer
    than PREFILL_MIN_Q query tokens are decodes; a prefill chunk of q tokens over c cached ones has
    q (c + q / 2) causal-attention pairs (dsim.cost.CostModel.prefill_ms)."""
    dec = sum(int(x) for x in q if x < PREFILL_MIN_Q)
    pairs = sum(x * (c + 0.5 * x) for x, c in zip(q, ctx) if x >= PREFILL_MIN_Q) / 1e6
    return dec, float(pairs)


ATTENTION_TERMS = ("dec", "wpre", "wave", "chunks", "merge")
# per decode request and the schedule's tail (dsim.cost.request_features): fitted only where the
# points vary the request count at a fixed token count (the request grid, request_grid_plan); the
# table alone ties each n to one request count and cannot tell them from F(n)
REQUEST_TERMS = ("reqs", "tail", "dpath")


def attention_structure(dims: dict, split: dict, decode_ctas_per_sm: int, prefill_ctas_per_sm: int) -> Any:
    """dsim.cost.AttentionTerms of the executor's kernels for a model (coefficients 0): heads,
    split-KV settings (model.SPLIT keys), FLASH_BLOCK_M query rows per CTA, the occupancies given."""
    from dsim.cost import AttentionTerms

    return AttentionTerms(
        query_heads=int(dims["heads"]),
        kv_heads=int(dims["kv_heads"]),
        sms=int(split.get("sms", 132)),
        fill=float(split["fill"]),
        balance=float(split.get("balance") or 0.0),
        min_chunk=int(split["min_chunk"]),
        block_rows=128,
        decode_ctas_per_sm=int(decode_ctas_per_sm),
        prefill_ctas_per_sm=int(prefill_ctas_per_sm),
        wave_ms_per_ktok=0.0,
        chunk_ms_per_kcta=0.0,
        merge_ms_per_mcell=0.0,
        prefill_ms_per_mpair=0.0,
    )


def attention_features(q: Sequence[int], ctx: Sequence[int], a: Any) -> dict:
    """The attention features of a step shape (dsim.cost.decode_features over its decode requests,
    q < PREFILL_MIN_Q; dsim.cost.prefill_pairs summed over its prefill chunks): wave, chunks, merge,
    wpre, reqs, tail."""
    from dsim.cost import decode_features, prefill_pairs, request_features

    dq = [int(x) for x in q if x < PREFILL_MIN_Q]
    dc = [int(c) for x, c in zip(q, ctx) if x < PREFILL_MIN_Q]
    wave, chunks, merge = decode_features(dq, dc, a) if dq else (0.0, 0.0, 0.0)
    reqs, tail = request_features(dq, dc, a)
    dpath = 1.0 if dq else 0.0  # the step runs the split-KV decode path (its per-step kernels)
    wpre = sum(prefill_pairs(int(x), int(c), a) for x, c in zip(q, ctx) if x >= PREFILL_MIN_Q)
    return dict(wave=wave, chunks=chunks, merge=merge, wpre=float(wpre), reqs=reqs, tail=tail, dpath=dpath)


def isotonic(y: Sequence[float] | np.ndarray) -> np.ndarray:
    """The non-decreasing sequence nearest to y in least squares (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, count]
    for v in np.asarray(y, dtype=float):
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, c2 = blocks.pop()
            m1, c1 = blocks.pop()
            blocks.append([(m1 * c1 + m2 * c2) / (c1 + c2), c1 + c2])
    return np.concatenate([np.full(int(c), m) for m, c in blocks]) if blocks else np.zeros(0)


def fit_step_model(
    points: list[dict],
    attention: Any = None,
    request_terms: bool = False,
    monotone: bool = False,
    knots: Sequence[int] | None = None,
) -> dict:
    """Least squares step_ms = F(n) + slope * kv / 1000 (+ prefill terms), one free F per distinct n.

    points: dicts with n (token count the step ran with, i.e. padded), kv, ms; a point whose tag is
    in FIT_EXCLUDE (or with fit=False; tail-prefill without the prefill terms) is not fitted, only its
    signed error reported
    (not_fitted_signed_pct). Points tagged SLOPE_ONLY get an intercept of their own per (n, R, window)
    group instead of F(n): they set the KV slope (context series of one shape) but not the forward
    table, which comes from the steps shaped like dsim's (their signed error against F(n) is reported
    too, under slope_only_signed_pct).
    When every point carries n_real, dec (decode tokens) and pre (prefill pairs / 1e6, step_terms),
    the model also has a x decode tokens and beta x pre (decode tokens cost more than prompt
    tokens, an LM-head row each plus per-row attention work; a prefill chunk pays its causal
    attention). The table is then priced for decode tokens, F(n) + a n, as dsim's cost model wants
    it (dsim.cost: a prompt token costs a less and a chunk adds beta x its pairs), and the result
    has prefill_terms = {discount_ms_per_ktok: a, attention_ms_per_mpair: beta}. A coefficient
    that fits negative is pinned at 0.
    knots: where given, only these sizes get a free F; a point at another size between two of
    them is priced by the linear interpolation of their F (as dsim's cost model reads the table
    above the capture limit, where steps run at their own size), so one step at an odd size (a
    context-sweep point) informs the terms instead of getting an F of its own that lifts the
    table around it. Sizes outside every knot pair keep a free F.
    Returns {"tokens": [...], "F": [...], "kv_ms_per_ktok": slope, "residual_pct": {...}, ...}.
    """
    allpts = points
    terms = ["dec", "pre"] if all("dec" in p and "pre" in p and "n_real" in p for p in allpts) else []
    if attention is not None:  # per-request attention terms: every point needs its shape
        missing = [p.get("tag") for p in allpts if "shape_q" not in p or "shape_ctx" not in p]
        if missing:
            raise ValueError(
                f"fit with attention terms: {len(missing)} points without shape_q/shape_ctx (e.g. {missing[0]})"
            )
        for p in allpts:
            p.update(attention_features(p["shape_q"], p["shape_ctx"], attention))
        terms = list(ATTENTION_TERMS) + (list(REQUEST_TERMS) if request_terms else [])
    # without the prefill terms a single whole-size prompt chunk is off the model (its attention
    # grows with the square of the chunk): measured and reported, not fitted
    excl = FIT_EXCLUDE if terms else FIT_EXCLUDE + ("tail-prefill",)
    points = [p for p in points if p.get("fit", True) and p.get("tag") not in excl]
    held = [p for p in allpts if p not in points]

    def grp(p: dict) -> Any:
        return (int(p["n"]), int(p.get("R", 0)), int(p.get("s", 0))) if p.get("tag") in SLOPE_ONLY else None

    ns = sorted({int(p["n"]) for p in points if grp(p) is None})
    between: dict[int, tuple[int, int]] = {}  # a size priced by two knots' F (knots, module doc)
    if knots is not None:
        kn = sorted({int(k) for k in knots} & set(ns))
        for n in ns:
            i = bisect.bisect_left(kn, n)
            if n not in kn and 0 < i < len(kn):
                between[n] = (kn[i - 1], kn[i])
        ns = [n for n in ns if n not in between]
    groups = sorted({grp(p) for p in points if grp(p) is not None})
    gcount = {g: sum(1 for p in points if grp(p) == g) for g in groups}
    groups = [g for g in groups if gcount[g] >= 2]  # a lone point carries no slope information
    slope_pts = [p for p in points if grp(p) is not None]
    points = [p for p in points if grp(p) is None or grp(p) in groups]
    idx = {n: i for i, n in enumerate(ns)}
    gidx = {g: len(ns) + i for i, g in enumerate(groups)}
    base = len(ns) + len(groups)

    def row(p: dict) -> np.ndarray:
        r = np.zeros(base + 1 + len(terms))
        g = grp(p)
        n = int(p["n"])
        if g is None and n in between:
            lo, hi = between[n]
            r[idx[lo]], r[idx[hi]] = (hi - n) / (hi - lo), (n - lo) / (hi - lo)
        elif g is None or g in gidx:
            r[idx[n] if g is None else gidx[g]] = 1.0
        r[base] = p["kv"] / 1000.0
        for j, t in enumerate(terms):
            r[base + 1 + j] = p["dec"] / 1000.0 if t == "dec" else p[t]
        return r

    A = np.array([row(p) for p in points])
    y = np.array([float(p["ms"]) for p in points])
    w = 1.0 / np.maximum(y, 1e-6)  # relative weighting: every point counts by its relative error
    cols = list(range(A.shape[1]))
    while True:  # pin a negative KV slope or prefill term at 0
        coef_c, *_ = np.linalg.lstsq(A[:, cols] * w[:, None], y * w, rcond=None)
        coef = np.zeros(A.shape[1])
        coef[cols] = coef_c
        neg = [c for c in cols if c >= base and coef[c] < 0]
        if not neg:
            break
        cols.remove(min(neg, key=lambda c: coef[c]))
    slope = float(coef[base])
    extra = dict(zip(terms, coef[base + 1 :]))
    a = float(extra.get("dec", 0.0))  # ms per 1000 decode tokens
    F = np.maximum(coef[: len(ns)], 1e-4)
    if monotone and ns:
        # the table dsim reads (F + a n) made non-decreasing by least squares (pool adjacent
        # violators), not by a running maximum: one slow measurement at one size must not lift every
        # larger size's cost
        nn = np.asarray(ns, dtype=float)
        F = np.maximum(isotonic(F + a * nn / 1000.0) - a * nn / 1000.0, 1e-4)
    pred = A @ np.concatenate([F, coef[len(ns) :]])
    rel = (pred - y) / y * 100
    by_tag: dict[str, list] = {}
    for p, e in zip(points, rel):
        by_tag.setdefault(p.get("tag", ""), []).append(abs(float(e)))
    Fn = dict(zip(ns, F))

    def signed(pts: Iterable[dict]) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {}
        for p in pts:
            n = int(p["n"])
            f = Fn[n] if n in Fn else float(np.interp(n, ns, F))
            e = f + slope * p["kv"] / 1000.0
            for t in terms:
                e += float(extra[t]) * (p[t] / 1000.0 if t == "dec" else p[t])
            out.setdefault(p.get("tag", ""), []).append(round(float((e - p["ms"]) / p["ms"] * 100), 2))
        return out

    # the table as dsim reads it: every token priced as a decode token
    table = [float(f + a * n / 1000.0) for n, f in zip(ns, F)]
    out = dict(
        tokens=ns,
        F=table,
        kv_ms_per_ktok=slope,
        residual_pct=dict(
            median_abs=float(np.median(np.abs(rel))),
            p90_abs=float(np.percentile(np.abs(rel), 90)),
            max_abs=float(np.max(np.abs(rel))),
            by_tag={k: round(median(v), 3) for k, v in by_tag.items()},
        ),
    )
    if terms:
        out["prefill_terms"] = {
            "discount_ms_per_ktok": round(a, 6),
            "attention_ms_per_mpair": round(float(extra.get("pre", 0.0)), 6),
        }
    if attention is not None:
        attn: dict[str, Any] = dict(
            {
                k: getattr(attention, k)
                for k in (
                    "query_heads",
                    "kv_heads",
                    "sms",
                    "fill",
                    "balance",
                    "min_chunk",
                    "block_rows",
                    "decode_ctas_per_sm",
                    "prefill_ctas_per_sm",
                )
            },
            wave_ms_per_ktok=round(float(extra["wave"]), 6),
            chunk_ms_per_kcta=round(float(extra["chunks"]), 6),
            merge_ms_per_mcell=round(float(extra["merge"]), 6),
            prefill_ms_per_mpair=round(float(extra["wpre"]), 6),
        )
        if request_terms:
            attn.update(
                ms_per_request=round(float(extra["reqs"]), 6),
                tail_ms_per_ktok=round(float(extra["tail"]), 6),
                decode_step_ms=round(float(extra["dpath"]), 6),
            )
        out["attention"] = attn
    if held:  # not fitted: signed error of the fitted model (interpolated between fitted sizes)
        out["not_fitted_signed_pct"] = signed(held)
    if slope_pts:
        out["slope_only_signed_pct"] = signed(slope_pts)
    out["slope_groups"] = len(groups)
    return out


def kv_slope_by_window(points: list[dict], n: int = 128, lo: int = 1024, hi: int = 8192) -> dict:
    """ms per 1000 KV tokens between uniform points at contexts lo and hi with the same n and window s
    (one request count R = n / s each): the KV cost's dependence on the verify window."""
    by = {}
    for p in points:
        if int(p["n"]) == n and p.get("tag") in ("table", "context") and p.get("ctx_min", p["ctx"]) == p["ctx"]:
            by[(int(p["s"]), int(p["ctx"]))] = p
    out = {}
    for s in sorted({k[0] for k in by}):
        a, b = by.get((s, lo)), by.get((s, hi))
        if a and b and b["kv"] > a["kv"]:
            out[f"q{s}"] = round((b["ms"] - a["ms"]) / ((b["kv"] - a["kv"]) / 1000.0), 5)
    return out


def forward_table(fit: dict, caps: list[int]) -> dict:
    """Forward table over the fitted sizes plus every capture size; capture sizes that were not
    measured (quick sweeps only) are interpolated and listed under 'interpolated'."""
    toks = np.asarray(fit["tokens"], dtype=float)
    F = np.asarray(fit["F"], dtype=float)
    missing = [c for c in caps if c not in set(int(t) for t in toks)]
    allx = sorted(set(int(t) for t in toks) | set(caps))
    ms = np.interp(allx, toks, F)
    d = {"tokens": [int(t) for t in allx], "ms": [round(float(v), 5) for v in ms]}
    if missing:
        d["interpolated"] = missing
    return d


def cost_model(profile: dict, where: str = "<profile>") -> CostModel:
    """dsim's cost model of a profile given as a parsed YAML dict."""
    return CostModel(profile_from_dict(profile, where))


def predicted_step_ms(cost: CostModel, shape: StepShape) -> float:
    """dsim's forward-only cost of a step shape: CostModel.step_ms of its tokens and KV after its new
    tokens, plus CostModel.prefill_ms of its prefill chunks (q >= PREFILL_MIN_Q) and
    CostModel.context_ms of its decode/verify requests (0 for a profile without attention terms)."""
    chunks = [(q, c) for q, c in zip(shape.q, shape.ctx) if q >= PREFILL_MIN_Q]
    dq = [q for q in shape.q if q < PREFILL_MIN_Q]
    dc = [c for q, c in zip(shape.q, shape.ctx) if q < PREFILL_MIN_Q]
    ctx_ms = cost.context_ms(dq, dc) if dq else 0.0
    return float(cost.step_ms(shape.n, shape.kv)) + float(cost.prefill_ms(chunks)) + float(ctx_ms)
