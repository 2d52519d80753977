"""Prefill terms of a composed profile (prefill_terms version 2, dsim.cost module doc): the attention-core
cost of one-chunk records beyond the decode-priced part, less the LM-head rows they skip (``prefill_excess``),
fitted as pairs with the cache and within the chunk, a signed per-token and a per-step term
(``fit_prefill_terms``); for an executor with step-wide key lists (step_keys) the chunk's own key lists
at those terms' cell prices instead of the pair terms.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

from dsim.cost import PrefillTerms, RequestAttention
from dsim.profiling.kernel_ops import KV_LO, kernel_op
from dsim.profiling.models import MoEModel
from dsim.profiling.pricer import Pricer
from dsim.profiling.request_attention import attention_cores_ms
from dsim.profiling.topology import Topology

if TYPE_CHECKING:
    from collections.abc import Sequence


PREFILL_Q = (256, 512, 1024, 2048, 8192)  # prompt-chunk lengths the prefill terms are fitted on
PREFILL_KV = (0, 512, 2048, 8192, 32768)  # cached context before the chunk


def prefill_excess(
    model: MoEModel, topo: Topology, hardware: str, pricer: Pricer, slope_ms_per_tok: float
) -> list[tuple[int, int, float]]:
    """The (q, c, excess ms) points fit_prefill_terms fits, at PREFILL_Q x PREFILL_KV: what a prompt chunk of
    q tokens over c cached costs beyond the q decode tokens the forward table priced it as (q one-token
    requests at zero context plus the KV slope, `slope_ms_per_tok`), less the LM-head rows it skips, from
    the tables' one-chunk attention-core records."""
    lm = [
        pricer.ms(kernel_op("lm_head", 1, op="gemm", dtype="bf16", m=m, n=model.vocab // topo.attn_tp, k=model.hidden))
        for m in (8192, 16384)
    ]
    lm_per_tok = max(0.0, (lm[1] - lm[0]) / 8192)
    excess = []
    for qn in PREFILL_Q:
        decode_share = attention_cores_ms(model, topo, hardware, pricer, phase="decode", batch=qn, q=1, kv=KV_LO)
        decode_share -= slope_ms_per_tok * qn * KV_LO
        for c in PREFILL_KV:
            t = attention_cores_ms(model, topo, hardware, pricer, phase="prefill", batch=1, q=qn, kv=c)
            excess.append((qn, c, t - decode_share - slope_ms_per_tok * c - qn * lm_per_tok))
    return excess


def fit_prefill_terms(
    excess: Sequence[tuple[int, int, float]], step_attention: RequestAttention | None, last_slope_ms_per_ktok: float
) -> PrefillTerms:
    """prefill_terms version 2 (dsim.cost module doc) from (q, c, excess ms) points: what one chunk
    of q tokens over c cached costs beyond its q decode tokens, from the kernel table's one-chunk
    records. With the executor's step-keys terms (``step_attention`` carries them) a chunk's own key
    lists are priced at those terms' cell prices, not fitted (own_keys_tokens: a decode token of
    the forward table, one token over KV_LO cached), and only a signed per-token and a per-step
    rest are fitted on what they leave; otherwise cached pairs, within-chunk pairs (both >= 0), a
    signed per-token term and a per-step term (>= 0) are fitted, least squares in ms. A lone
    chunk's fixed excess is its step's: the fit cannot tell per chunk from per step, and both
    executors run a step's chunks in one attention launch per layer, so it is priced per step.
    A negative per-token term is held so that a prompt token costs at most 0.9 of the forward
    table's last slope less than a decode token."""
    from scipy.optimize import lsq_linear

    from dsim.cost import PrefillTerms, own_keys_ms, prefill_discount_bound_ms_per_ktok

    q = np.array([e[0] for e in excess], dtype=float)
    c = np.array([e[1] for e in excess], dtype=float)
    y = np.array([e[2] for e in excess], dtype=float)
    own_tokens = KV_LO + 1 if step_attention is not None and step_attention.step_keys else 0
    base = PrefillTerms(own_keys_tokens=own_tokens)
    own = np.array([own_keys_ms(int(a), int(b), base, step_attention) for a, b in zip(q, c)])
    cols = {"token_ms_per_ktok": q / 1000, "ms_per_step": np.ones_like(q)}
    if not own_tokens:
        cols = {"cached_ms_per_mpair": q * c / 1e6, "within_ms_per_mpair": q * q / 2e6, **cols}
    names = list(cols)
    lo = [-np.inf if k == "token_ms_per_ktok" else 0.0 for k in names]
    sol = lsq_linear(np.stack([cols[k] for k in names], axis=1), y - own, bounds=(lo, [np.inf] * len(names)))
    coef = dict(zip(names, (float(v) for v in sol.x)))
    terms = PrefillTerms(own_keys_tokens=own_tokens, **coef)  # type: ignore[arg-type]
    bound = prefill_discount_bound_ms_per_ktok(terms, step_attention)
    if bound > 0.9 * last_slope_ms_per_ktok:
        coef["token_ms_per_ktok"] += bound - 0.9 * last_slope_ms_per_ktok
        terms = PrefillTerms(own_keys_tokens=own_tokens, **coef)  # type: ignore[arg-type]
    pred = own + sum(coef[k] * cols[k] for k in names)
    resid = y - pred
    old_resid = _v1_prefill_residual(q, c, y, last_slope_ms_per_ktok)
    fit = dict(
        form="prefill_terms version 2: "
        + (
            "own key lists at the step-keys and indexer cell prices, plus a signed per-token and a per-step rest"
            if own_tokens
            else "cached pairs, within-chunk pairs, a signed per-token and a per-step term"
        ),
        records="one-chunk attention-core records (batch 1, prefill phase) of the kernel table, less the q one-token "
        "decode records (batch q, KV_LO context, less the KV slope) the forward table priced the chunk as, the KV "
        "slope of the cached tokens and the LM-head rows a prompt token skips",
        q=sorted({int(v) for v in q}),
        cached=sorted({int(v) for v in c}),
        points=len(y),
        terms={k: round(v, 6) for k, v in coef.items()},
        residual_ms_max=round(float(np.abs(resid).max()), 4),
        residual_ms_median=round(float(np.median(np.abs(resid))), 4),
        residual_rel_median=round(float(np.median(np.abs(resid) / np.maximum(np.abs(y), 1.0))), 4),
        residual_ms_max_version_1=round(float(old_resid), 4),
    )
    return dataclasses.replace(terms, fit=fit)


def _v1_prefill_residual(q: np.ndarray, c: np.ndarray, y: np.ndarray, last_slope_ms_per_ktok: float) -> float:
    """The largest residual of the version-1 form (pairs q (c + q / 2) x a rate minus a per-token
    discount, both >= 0) on the same points: the fit version 2 replaces, kept in provenance."""
    from scipy.optimize import nnls

    x, k = q * (c + q / 2) / 1e6, q / 1000
    (a, d), _ = nnls(np.stack([x, -k], axis=1), y)
    d = min(d, 0.9 * last_slope_ms_per_ktok)
    return float(np.abs(y - a * x + d * k).max())
