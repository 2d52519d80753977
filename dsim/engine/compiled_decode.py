"""A step's (or a decode window's) decode slots planned and committed, as compiled kernels (numba,
nopython, cached on disk).

* ``plan_decodes``: the draws (dsim.engine.compiled_draws) and verify windows
  (dsim.engine.compiled_budget) of up to a window of steps, each step's budgets priced at its own
  KV context, step by step;
* ``commit_decodes``: accepted, emitted tokens, speculative counters, the accepted-drafts
  histogram; ``remove_done``: the order-preserving removal of finished slots; ``new_slots``:
  prefills that become decode slots.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from dsim.engine.compiled_budget import GROUPED_MIN, _scores, _windows_scored, verify_commit
from dsim.engine.compiled_bundles import (
    ASUM,
    CLS,
    COMP,
    EMITS,
    END,
    FIXED,
    ID,
    NCOL,
    PAPER,
    PAPER_PRODUCTION,
    ROUNDS,
    SGLANG,
    THRESHOLD,
    VLLM,
    VSUM,
    BudgetRow,
    CommitOut,
    DecodePlan,
    DrawParams,
    PolicyParams,
    RequestColumns,
    SlotTable,
)
from dsim.engine.compiled_draws import _draw_step, _half_logits

# ---- decode windows: budgets priced at each step's own KV context -----------------------------
# A window's step t prices its budgets at the KV context its earlier steps emitted, which depends
# on their windows: step t's windows are a function of steps 0..t-1 only, so solving the steps in
# order (plan_decodes) gives each step its exact context with one policy solve a step.


@njit(cache=True)
def plan_decodes(slots, n, K, steps, draws, policy, budget, plan):
    """Draws (``draw_slots``; draws: a DrawParams) and verify windows of up to ``steps`` steps of
    the first n decode slots (slots: a SlotTable), step by step: adaptive, the budget policy
    (policy: a PolicyParams) on the cost row of ``budget`` (a BudgetRow) plus its extra_ms, and (a
    window of several steps) the policy's context_ms_per_tok x the KV tokens the earlier steps
    emitted (each step's own context); else the full block. The confidences one and two steps
    back are the previous steps', before the first step the slots' history rows X[cp:cp+K] and
    X[cp2:cp2+K] (cp2 < 0: not kept, the policy does not read it). Stops after the first step
    where some slot may finish (its committed tokens reach its remaining output): later steps
    never run. Writes conf [steps, K, n], lead, verified and commit cap [steps, n] of the steps
    planned (plan: a DecodePlan); returns (drafts verified in the first step, steps planned)."""
    slots, draws, policy, budget, plan = (
        SlotTable(*slots), DrawParams(*draws), PolicyParams(*policy), BudgetRow(*budget), DecodePlan(*plan)
    )  # fmt: skip
    I, X = slots.ints, slots.rows
    head = draws.head
    adaptive, code, tau, mode = policy.adaptive, policy.code, policy.tau, policy.verify_mode
    cp = policy.hist_row if policy.hist_row >= 0 else 0
    cp2 = policy.hist2_row
    kv_ms_per_tok = policy.context_ms_per_tok
    row, base_extra, n_nondraft, token_limit = budget.row, budget.extra_ms, budget.n_nondraft, budget.token_limit
    conf, lead, verified, cap = plan.conf, plan.lead, plan.verified, plan.cap
    nothing_b = np.zeros((0, 0, 0), np.bool_)
    nothing_f = np.zeros((0, 0, 0), np.float32)
    RK = n * K
    scored = adaptive and code != FIXED
    flat = np.empty((3, RK if scored else 0), np.float32)  # step t's scores in row t % 3
    grouped = RK >= GROUPED_MIN  # (vllm and paper-production budgets from scores in any order)
    srt = np.empty((3, RK if scored else 0), np.float32)  # step t's scores sorted, in row t % 3
    back = 0  # how many steps back the budget's confidences are (vllm 1, paper-production 2)
    if adaptive and (code == VLLM or (code == PAPER_PRODUCTION and cp2 < 0)):
        back = 1
    elif adaptive and code == PAPER_PRODUCTION:
        back = 2
    none = np.empty(0, np.float32)
    hist = np.empty((2, RK if back else 0), np.float32)  # the history's scores: two, one step before
    if back:
        tmp = np.empty(RK if not grouped else 0, np.float32)
        # (grouped: in request order; else sorted)
        _scores(X[cp : cp + K, :n], K, n, hist[1] if grouped else tmp, none if grouped else hist[1])
        if back == 2:
            _scores(X[cp2 : cp2 + K, :n], K, n, hist[0] if grouped else tmp, none if grouped else hist[0])
    Y = _half_logits(K, n, head)
    win = np.empty(n, np.int64)
    left0 = np.empty(n, np.int64)
    for r in range(n):
        left0[r] = I[r, END] - I[r, COMP]
    cum = np.zeros(n, np.int64)
    em_prev = np.zeros(n, np.int64)
    ctx = 0
    per_ctx = steps > 1 and code != FIXED and code != THRESHOLD
    done = steps
    for t in range(steps):
        _draw_step(draws, I, X, n, K, t, False, (conf, lead, nothing_b, nothing_f), Y)
        if adaptive:
            f = flat[t % 3] if scored else none
            own = none
            if scored:
                # sorted where this step's policy reads the order, or a later step's budget will
                if code == PAPER or code == SGLANG or (back and not grouped and t + back < steps):
                    own = srt[t % 3]
                _scores(conf[t], K, n, f, own)
            src = none
            if back:
                if t >= back:
                    src = (flat if grouped else srt)[(t - back) % 3]  # (`back` steps before, still there)
                else:
                    src = hist[t] if back == 2 else hist[1]
            extra = base_extra + kv_ms_per_tok * ctx if per_ctx else base_extra
            step_budget = (row, extra, float(n), n_nondraft, token_limit)  # (a PolicyBudget)
            _windows_scored(code, tau, f, own, src, step_budget, K, n, win)
            for r in range(n):
                verified[t, r], cap[t, r] = verify_commit(mode, win[r], K)
        else:
            for r in range(n):
                verified[t, r], cap[t, r] = verify_commit(mode, K, K)
        # the tokens this step commits: the next step's context, and whether some slot may finish
        step_e = 0
        found = False
        for r in range(n):
            c = cap[t, r]
            a = lead[t, r] if lead[t, r] < c else c
            cum[r] += a + 1
            e = cum[r] if cum[r] < left0[r] else left0[r]
            step_e += e - em_prev[r]
            em_prev[r] = e
            if cum[r] >= left0[r]:
                found = True
        ctx += step_e
        if found:
            done = t + 1
            break
    v0 = 0
    if done > 0:
        for r in range(n):
            v0 += verified[0, r]
    return v0, done


# ---- commit -----------------------------------------------------------------------------------


@njit(cache=True)
def commit_decodes(slots, n, m, K, plan, given, itl_ms, out, policy):
    """Commit m steps of the first n decode slots (slots: a SlotTable; plan: a DecodePlan of m
    steps, not read when K = 0; out: a CommitOut; policy: a PolicyParams, for its history rows):
    per slot and step, accepted = min(full-block
    lead, commit cap) (a decode cut by the token budget, given[r] >= 0 tokens, verifies and commits
    at most given - 1 drafts and emits nothing when given = 0), emitted = accepted + 1, the slot's
    total capped by its remaining output. Updates I's COMP and speculative counters (ROUNDS,
    ASUM, VSUM) and the accepted-drafts histogram; writes per slot em[r] (tokens committed),
    ver_r[r] and acc_r[r] (drafts verified and accepted over the m steps) and per step
    the verified, accepted and emitted totals (the last step's emitted net of output caps).
    With ``itl_ms`` >= 0 (every slot emitted at the previous step's end and emits each of these
    steps, the largest gap being itl_ms) also each slot's emission count (EMITS += m) and largest
    ITL (F[r, 1]). The per-slot outputs are slot_out's rows (em, ver_r, acc_r), the per-step
    totals step_out's (verified, accepted, emitted). With drafts and cp >= 0 also the slots'
    confidence history: X rows cp..cp+K-1 = the last step's confidences conf[m - 1] and, with
    cp2 >= 0, rows cp2.. = the step's before (conf[m - 2], or the old rows cp.. after one step).
    Returns (verified, accepted, full-block accepted, emitted, min remaining output)."""
    slots, plan, out, policy = SlotTable(*slots), DecodePlan(*plan), CommitOut(*out), PolicyParams(*policy)
    I, F, X = slots.ints, slots.floats, slots.rows
    conf, lead, verified, cap = plan.conf, plan.lead, plan.verified, plan.cap
    hist, slot_out, step_out = out.hist, out.slot_out, out.step_out
    cp, cp2 = policy.hist_row, policy.hist2_row
    em = slot_out[0]
    ver_r = slot_out[1]
    acc_r = slot_out[2]
    step_ver = step_out[0]
    step_acc = step_out[1]
    step_emit = step_out[2]
    vtot = 0
    atot = 0
    ltot = 0
    etot = 0
    for t in range(m):
        step_ver[t] = 0
        step_acc[t] = 0
        step_emit[t] = 0
    min_left = np.int64(1) << 62
    if K == 0:  # one token a step for every decode given one (the loop below, without drafts)
        running = 0
        for r in range(n):
            left = I[r, END] - I[r, COMP]
            e = m if given[r] != 0 else 0
            if e > 0:
                running += 1
            if e > left:
                e = left
            em[r] = e
            ver_r[r] = 0
            acc_r[r] = 0
            etot += e
            I[r, COMP] += e
            if itl_ms >= 0.0:
                I[r, EMITS] += m
                if F[r, 1] < itl_ms:
                    F[r, 1] = itl_ms
            lr = left - e
            if lr < min_left:
                min_left = lr
        for t in range(m - 1):
            step_emit[t] = running
        step_emit[m - 1] = etot - running * (m - 1)
        if n == 0:
            min_left = 0
        return 0, 0, 0, etot, min_left
    for r in range(n):
        left = I[r, END] - I[r, COMP]
        e = 0
        a_sum = 0
        v_sum = 0
        g = given[r]
        for t in range(m):
            if K > 0:
                v = verified[t, r]
                c = cap[t, r]
                ld = lead[t, r]
            else:
                v = 0
                c = 0
                ld = 0
            if g >= 0:
                gg = g - 1 if g > 0 else 0
                if v > gg:
                    v = gg
                if c > gg:
                    c = gg
            a = ld if ld < c else c
            if K > 0:
                hist[a] += 1
            a_sum += a
            v_sum += v
            ltot += ld
            step_ver[t] += v
            step_acc[t] += a
            if g != 0:
                e += a + 1
                if t < m - 1:
                    step_emit[t] += a + 1
        if e > left:
            e = left
        em[r] = e
        ver_r[r] = v_sum
        acc_r[r] = a_sum
        etot += e
        if K > 0:
            I[r, ROUNDS] += m
            I[r, ASUM] += a_sum
            I[r, VSUM] += v_sum
        I[r, COMP] += e
        if itl_ms >= 0.0:
            I[r, EMITS] += m
            if F[r, 1] < itl_ms:
                F[r, 1] = itl_ms
        vtot += v_sum
        atot += a_sum
        lr = left - e
        if lr < min_left:
            min_left = lr
    prior = 0
    for t in range(m - 1):
        prior += step_emit[t]
    step_emit[m - 1] = etot - prior
    if n == 0:
        min_left = 0
    if cp >= 0:  # (row by row: contiguous copies; the history's rows are disjoint blocks)
        if cp2 >= 0:  # (the production policy's)
            for j in range(K):
                for r in range(n):
                    X[cp2 + j, r] = conf[m - 2, j, r] if m >= 2 else X[cp + j, r]
        for j in range(K):
            for r in range(n):
                X[cp + j, r] = conf[m - 1, j, r]
    return vtot, atot, ltot, etot, min_left


@njit(cache=True)
def remove_done(slots, n, done_I, done_F, d0, t_now):
    """Remove the slots with nothing left to emit (COMP >= END), keeping the others' order in
    place; their rows go to done_I (int64 [rows, NCOL]) / done_F (float64 [rows, 3]) from row d0
    on (in slot order; done_F's columns: the two of SlotTable.floats, then the finish time t_now).
    Returns (slots kept, slots removed, smallest remaining output among the kept, KV tokens of the
    removed)."""
    slots = SlotTable(*slots)
    I, F, X = slots.ints, slots.floats, slots.rows
    w = 0
    d = 0
    done_kv = 0
    min_left = np.int64(1) << 62
    rows = X.shape[0]
    for r in range(n):
        left = I[r, END] - I[r, COMP]
        if left <= 0:
            for c in range(NCOL):
                done_I[d0 + d, c] = I[r, c]
            done_F[d0 + d, 0] = F[r, 0]
            done_F[d0 + d, 1] = F[r, 1]
            done_F[d0 + d, 2] = t_now
            done_kv += I[r, COMP]
            d += 1
        else:
            if w != r:
                for c in range(NCOL):
                    I[w, c] = I[r, c]
                F[w, 0] = F[r, 0]
                F[w, 1] = F[r, 1]
                for q in range(rows):
                    X[q, w] = X[q, r]
            if left < min_left:
                min_left = left
            w += 1
    if w == 0:
        min_left = 0
    return w, d, min_left, done_kv


@njit(cache=True)
def new_slots(slots, n, moved, m, t_now, req):
    """Append m decode slots after the first n for the requests whose prefill ended at t_now
    (req: the RequestColumns they are read from and written to):
    moved[6 i : 6 i + 6] = (request id, KV tokens, outputs generated before this token,
    ROUNDS, ASUM, VSUM) of the i-th, in order. Writes the slots' int rows (ID, COMP, END = prompt
    + output - 1, CLS, EMITS, the counters), float rows (last emission t_now, largest ITL) and,
    where X has rows, their columns from slot_rows; each request's last emission (t_now) and,
    for a first token, its time. The caller has grown the buffers. Returns the smallest remaining
    output (END - COMP) of the new slots (2**62 when m = 0)."""
    slots, req = SlotTable(*slots), RequestColumns(*req)
    I, F, X = slots.ints, slots.floats, slots.rows
    prompt, output, cls, emits = req.prompt, req.output, req.cls, req.emits
    itl_max, first_token, last_emit, slot_rows = req.itl_max, req.first_token, req.last_emit, req.slot_rows
    rows = X.shape[0]
    min_left = np.int64(1) << 62
    for i in range(m):
        rid = moved[6 * i]
        comp = moved[6 * i + 1]
        w = n + i
        end = prompt[rid] + output[rid] - 1
        I[w, ID] = rid
        I[w, COMP] = comp
        I[w, END] = end
        I[w, CLS] = cls[rid]
        I[w, EMITS] = emits[rid]
        I[w, ROUNDS] = moved[6 * i + 3]
        I[w, ASUM] = moved[6 * i + 4]
        I[w, VSUM] = moved[6 * i + 5]
        F[w, 0] = t_now
        F[w, 1] = itl_max[rid]
        for q in range(rows):
            X[q, w] = slot_rows[rid, q]
        if moved[6 * i + 2] == 0:
            first_token[rid] = t_now
        last_emit[rid] = t_now
        if end - comp < min_left:
            min_left = end - comp
    return min_left
