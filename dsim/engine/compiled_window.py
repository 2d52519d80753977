"""A decode window's pricing and rows, as compiled kernels (numba, nopython, cached on disk).

* the per-request attention terms of a step's decode slots: CostModel.context_args() packed for
  compiled calls (``pack_context_args``, a ContextArgs) and priced with dsim.cost's
  ``context_ms_compiled`` (``_context_ms_packed``, ``slots_context_ms``);
* ``window_steps``: a window's per-step shape (tokens, KV, forward, attention terms, duration,
  end) up to its first possible completion; ``window_rows``: its committed steps' rows and ITL
  samples;
* ``plan_window`` / ``commit_window``: a speculative window in two calls (dsim.engine.compiled_decode's
  plan and commit with the above).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from dsim.cost import context_ms_compiled
from dsim.engine.compiled_bundles import (
    COMP,
    END,
    SC_ACCEPTED,
    SC_DECODE,
    SC_DURATION,
    SC_EMITTED,
    SC_KV,
    SC_PREFILL,
    SC_REPLICA,
    SC_REQUESTS,
    SC_T_END,
    SC_TOKENS,
    SC_VERIFIED,
    SC_WAITING,
    CommitOut,
    ContextArgs,
    DecodePlan,
    SlotTable,
    WindowPricing,
    WindowRows,
)
from dsim.engine.compiled_decode import commit_decodes, plan_decodes

# CostModel.context_args() layout flattened, one letter a field (b flag, i int, f float, a array):
# on; the SplitKV (iiiifii); the six SplitKVCoefs; the RequestTableTerms (its flag and arrays, the
# KV slope, the indexer ratio, the step terms).
_CTX_PARTS = (1, 7, 6, 9)  # on, split, coefs, table
_CTX_KINDS = "biiiifiiffffffbaaaaafia"


def pack_context_args(ctx: tuple) -> tuple:
    """CostModel.context_args() as (ints int64[9], floats float64[8], the six arrays), so that a
    kernel call passes 8 objects, not 23 scalars and arrays (the dispatcher types every element
    of a tuple on every call); flags travel as 0/1 ints. The kernels rebuild context_ms_compiled's
    bundles with the same types the tuples have (int64, float64, bool, the arrays), hence the same
    compiled code. Raises TypeError where an element is not of its kind."""
    if len(ctx) != len(_CTX_PARTS) or any(
        not isinstance(part, tuple) or len(part) != m for part, m in zip(ctx[1:], _CTX_PARTS[1:])
    ):
        raise TypeError(f"context_args: parts of {_CTX_PARTS} fields expected (on, split, coefs, table)")
    flat = (ctx[0], *ctx[1], *ctx[2], *ctx[3])
    ints, floats, arrays = [], [], []
    for i, (x, kind) in enumerate(zip(flat, _CTX_KINDS)):
        if kind == "b" and isinstance(x, (bool, np.bool_)):
            ints.append(int(x))
        elif kind == "i" and isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)):
            ints.append(int(x))
        elif kind == "f" and isinstance(x, (float, np.floating)):
            floats.append(float(x))
        elif kind == "a" and isinstance(x, np.ndarray):
            arrays.append(x)
        else:
            raise TypeError(f"context_args field {i} (flattened): {type(x).__name__}, expected kind {kind!r}")
    return (np.array(ints, dtype=np.int64), np.array(floats, dtype=np.float64), *arrays)


@njit(cache=True, inline="always")
def _context_ms_packed(q, c, context):
    """context_ms_compiled(q, c, *context_args()[1:]) from pack_context_args' pieces (context: a
    ContextArgs): its bundles rebuilt from the packed ints and floats."""
    ci, cf, rb, rq, rc, rtab, rshare, rstep = ContextArgs(*context)
    split = (ci[1], ci[2], ci[3], ci[4], cf[0], ci[5], ci[6])
    coefs = (cf[1], cf[2], cf[3], cf[4], cf[5], cf[6])
    table = (ci[7] != 0, rb, rq, rc, rtab, rshare, cf[7], ci[8], rstep)
    return context_ms_compiled(q, c, split, coefs, table)


@njit(cache=True)
def slots_context_ms(slot_ints, n, K, verified, context):
    """dsim.cost.CostModel.context_ms of one step of the first n decode slots (1 + verified[0, r]
    query tokens each, 1 without drafts, over their COMP cached tokens) where no prefill chunk is
    priced with them, from CostModel.context_args() packed by ``pack_context_args`` (context, a
    ContextArgs): the same compiled function on the same values, without the Python call's array
    conversions. n >= 1."""
    I = slot_ints
    q = np.empty(n, np.int64)
    c = np.empty(n, np.int64)
    for r in range(n):
        q[r] = 1 + verified[0, r] if K > 0 else 1
        c[r] = I[r, COMP]
    return _context_ms_packed(q, c, context)


@njit(cache=True)
def window_steps(slot_ints, n, K, k, plan, pricing):
    """The shape of a k-step decode window of the first n slots (plan: a DecodePlan, its lead,
    commit cap, verified [>= k, n]; ignored when K = 0, one token a step; pricing: a
    WindowPricing), written into the rows of wi (int64 [3, >= k]:
    per step its tokens n_tok, tokens emitted before output caps, KV tokens read at its start
    plus its own tokens) and wf (float64 [5, >= k]: the forward fwd = fwd_table[n_tok] +
    kv_ms_per_tok x kv (ms; -1 where n_tok is past the table: the caller prices those), the
    per-request attention terms (dsim.cost.context_ms_compiled at the step's own windows and
    contexts, with CostModel.context_args() packed by ``pack_context_args``, a ContextArgs; 0
    when its ``on`` flag is off), the
    duration fwd + attention + fixed_ms, the end time (s, from t0_s) and the longest duration
    up to the step).
    Returns (last, general, past): the last step to run (the first step where some slot may
    finish, or the step before the KV cache runs out), whether even the first step needs a
    preemption (then the caller takes the general path), and whether some step is past the
    dense table. Only steps 0..last are written (none after them runs)."""
    I = slot_ints
    plan, pricing = DecodePlan(*plan), WindowPricing(*pricing)
    lead, cap, verified = plan.lead, plan.cap, plan.verified
    kv_dec, avail_blocks, lookahead = pricing.kv_dec, pricing.avail_blocks, pricing.lookahead
    fwd_table, kv_ms_per_tok, fixed_ms = pricing.fwd_table, pricing.kv_ms_per_tok, pricing.fixed_ms
    context = pricing.context
    t0_s, wi, wf = pricing.t0_s, pricing.wi, pricing.wf
    ctx_on = ContextArgs(*context).ints[0] != 0
    n_tok = wi[0]
    per_step = wi[1]
    kv = wi[2]
    fwd = wf[0]
    ctx_ms = wf[1]
    dur = wf[2]
    t_end = wf[3]
    dmax = wf[4]
    left = np.empty(n, np.int64)
    cum = np.zeros(n, np.int64)
    for r in range(n):
        left[r] = I[r, END] - I[r, COMP]
    last = k - 1
    found = False
    kv_start = kv_dec
    qb = np.empty(n if ctx_on else 0, np.int64)
    cb = np.empty(n if ctx_on else 0, np.int64)
    for t in range(k):
        tok = n
        ps = 0
        if ctx_on:
            for r in range(n):
                qb[r] = 1 + verified[t, r] if K > 0 else 1
                cb[r] = I[r, COMP] + cum[r]
            ctx_ms[t] = _context_ms_packed(qb, cb, context)
        else:
            ctx_ms[t] = 0.0
        for r in range(n):
            if K > 0:
                c = cap[t, r]
                a = lead[t, r] if lead[t, r] < c else c
                tok += verified[t, r]
                e = a + 1
            else:
                e = 1
            cum[r] += e
            ps += e
            if not found and cum[r] >= left[r]:
                found = True
                last = t
        n_tok[t] = tok
        per_step[t] = ps
        kv[t] = kv_start + tok
        kv_start += ps
        if found:  # (no step after the first possible completion runs)
            break
    past = False
    acc_ms = 0.0
    top = -np.inf
    for t in range(last + 1):
        if n_tok[t] < fwd_table.shape[0]:
            fwd[t] = fwd_table[n_tok[t]] + kv_ms_per_tok * kv[t]
            dur[t] = fwd[t] + ctx_ms[t] + fixed_ms
            acc_ms += dur[t]
            t_end[t] = t0_s + acc_ms / 1000.0
            if dur[t] > top:
                top = dur[t]
            dmax[t] = top
        else:
            past = True
            fwd[t] = -1.0
    # blocks held at the start of each step: an upper bound first, exact only near a full cache
    ks = kv[last] - n_tok[last]
    if (ks + n * (lookahead + 15)) // 16 > avail_blocks:
        before = np.zeros(n, np.int64)
        for t in range(last + 1):
            used = 0
            for r in range(n):
                used += (I[r, COMP] + before[r] + lookahead + 15) // 16
            if used > avail_blocks:
                if t == 0:
                    return 0, True, past
                return t - 1, False, past
            for r in range(n):
                if K > 0:
                    c = cap[t, r]
                    a = lead[t, r] if lead[t, r] < c else c
                    before[r] += a + 1
                else:
                    before[r] += 1
    return last, False, past


@njit(cache=True)
def window_rows(rows, m, n, step_out):
    """The step-table rows (dsim.engine.STEP_FIELDS order) of a decode window's m committed steps,
    written into rows.steps (column-major [fields, rows]) from rows.step_row (n slots decoding, no
    prefill, rows.n_waiting requests waiting; wi, wf: window_steps' rows; step_out: commit_decodes'
    per-step verified, accepted, emitted), and its ITL samples (each step's duration, n times)
    into rows.itl (column-major [2, rows]) from rows.itl_row."""
    rows = WindowRows(*rows)
    S, i, replica, n_waiting, V, j = rows.steps, rows.step_row, rows.replica, rows.n_waiting, rows.itl, rows.itl_row
    wi, wf = rows.wi, rows.wf
    for t in range(m):
        r = i + t
        S[SC_REPLICA, r] = replica
        S[SC_T_END, r] = wf[3, t]
        S[SC_DURATION, r] = wf[2, t]
        S[SC_REQUESTS, r] = n
        S[SC_DECODE, r] = n
        S[SC_TOKENS, r] = wi[0, t]
        S[SC_PREFILL, r] = 0
        S[SC_VERIFIED, r] = step_out[0, t]
        S[SC_ACCEPTED, r] = step_out[1, t]
        S[SC_EMITTED, r] = step_out[2, t]
        S[SC_KV, r] = wi[2, t]
        S[SC_WAITING, r] = n_waiting
        V[0, j + t] = wf[2, t]
        V[1, j + t] = n


@njit(cache=True)
def plan_window(slots, n, K, steps, draws, policy, budget, plan, pricing):
    """A speculative decode window's draws and shape in one call: ``plan_decodes`` over up to
    ``steps`` steps, then ``window_steps`` over the steps it planned (pricing: a WindowPricing).
    Returns (steps planned, last, general, past)."""
    _, k = plan_decodes(slots, n, K, steps, draws, policy, budget, plan)
    last, general, past = window_steps(SlotTable(*slots).ints, n, K, k, plan, pricing)
    return k, last, general, past


@njit(cache=True)
def commit_window(slots, n, m, K, plan, given, itl_ms, out, policy, rows):
    """A decode window's commit and its rows in one call: ``commit_decodes`` of its m steps, then
    ``window_rows`` (rows: a WindowRows) from its per-step totals. Returns commit_decodes'
    totals."""
    totals = commit_decodes(slots, n, m, K, plan, given, itl_ms, out, policy)
    window_rows(rows, m, n, CommitOut(*out).step_out)
    return totals
