"""The scheduler's per-step bookkeeping as compiled kernels (numba, nopython, cached on disk).

What the engine's general step does to its prefilling and waiting requests, over the request
table's int64 and float64 blocks (``dsim.engine.Requests.req_i`` / ``req_f``, rows named below):

* ``schedule_step``: vLLM V1's order within the token budget left after the decodes' 1 + K
  reservations: the running prefills' next chunks (in queue order, each at most
  long_prefill_token_threshold), their KV blocks (the decode slots' blocks from the cheap bound
  first, exactly only where it fails; where the cache cannot hold them nothing is written and the
  caller preempts), then FCFS admission from the waiting queue while budget, max_num_seqs and
  free blocks allow (``admit_waiting``);
* ``plan_general``: ``schedule_step``, then the decode slots' draws and verify windows
  (``dsim.kernels_step.plan_decodes``) priced by the engine's cost row of the step, in one call;
* ``commit_step``: after the step, in the order its effects happen: ``commit_prefills`` (the
  chunks computed; the prefills whose chunk ended their prompt sample a token and leave the
  queue as new decode slots, a resumed request's ITL gap noted), the decode slots' commit
  (``dsim.kernels_step.commit_decodes``) and ITL samples, the new slots
  (``dsim.kernels_step.new_slots``) and the removal of finished slots;
* ``run_general_steps``: consecutive general steps of one replica (the above, the step's
  duration, its records and counters, a closed loop's next requests) in one call, up to the
  replica's next outside event or the first step that needs Python.

The semantics are the engine's (docs/user/semantics.md §7, docs/dev/architecture.md "Engine"); this module moves
them out of Python, one call a step instead of a few Python statements a request. Prefix-cache
hits are looked up by the caller (a dict of block hashes) and passed in as counts: admission
never changes which blocks are cached, only the LRU order, which the caller applies afterwards
for the candidates the kernel considered.

Literal arguments: numba compiles a compiled function once more for each literal it is passed
from another compiled function (``plan_decodes(..., 1, ...)`` types its argument as
``Literal[int](1)``, not int64), and for a variable's first literal value while typing goes on
(``n = 0`` later reassigned). The calls between kernels therefore pass ``np.int64(...)`` /
``np.bool_(...)``, so that each kernel is compiled once, with the types that Python's calls give
it (the cold start's compile time; docs/results/performance.md "Compile time").
"""

from __future__ import annotations

import numpy as np
from numba import njit

from dsim.cost import KV_BLOCK_TOKENS, prefill_ms_compiled
from dsim.engine.compiled_step import (
    COMP,
    EMITS,
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
    _context_ms_packed,
    commit_decodes,
    new_slots,
    plan_decodes,
    remove_done,
)

# Rows of Requests.req_i (int64) and Requests.req_f (float64).
PROMPT, OUTPUT, CLASS, EMITTED, COMPUTED, GENERATED, BLOCKS, SEQ, CACHED, PREEMPTIONS = range(10)
HELD_ROUNDS, HELD_ACCEPTED, HELD_VERIFIED = range(10, 13)  # a preempted request's spec counters
REQ_I_ROWS = 13
ITL_MAX, FIRST_TOKEN, LAST_EMIT, ADMIT = range(4)
REQ_F_ROWS = 4

# schedule_step's status.
SCHEDULED, PREEMPT, MORE_HITS = range(3)

_BT = KV_BLOCK_TOKENS


@njit(cache=True, inline="always")
def _dec_blocks_exact(I, n_dec, lookahead):
    s = 0
    for r in range(n_dec):
        s += (I[r, COMP] + (lookahead + _BT - 1)) // _BT
    return s


@njit(cache=True, inline="always")
def _chunk(todo, left, thr):
    """A prefill's chunk this step: what is left of its prompt within the budget left, at most
    long_prefill_token_threshold (thr > 0)."""
    c = todo if todo < left else left
    if 0 < thr < c:
        c = thr
    return c


@njit(cache=True)
def admit_waiting(req_i, req_f, pre, n_pre, chunks, waitq, w_head, w_tail, hits, n_hits, I, n_dec, lookahead,
                  dec_bound, total_blocks, pre_blocks, left, n_run, max_seqs, thr, consumer, admit_seq, now,
                  n_pre_sample, kv_pre):  # fmt: skip
    """FCFS admission from waitq[w_head:w_tail] while left > 0 tokens, n_run < max_seqs and the
    request's blocks fit (dec_bound: total blocks less the decode slots' bound; the exact count
    only where it fails). n_hits < 0: no prefix cache (every hit 0); else hits[k] is the k-th
    candidate's cached prompt tokens, and admission stops after n_hits candidates (MORE_HITS: the
    caller looks up the next ones and calls again). An admitted request gets its computed tokens
    (hit, or for a KV consumer's first admission prompt - 1), blocks, admission time (first
    admission), admission number and chunk (pre[n_pre], chunks[n_pre]). Returns (status, n_pre,
    w_head, pre_blocks, admit_seq, left, n_pre_sample, kv_pre, candidates considered: the
    admitted plus a refused one)."""
    prompt, generated, computed = req_i[PROMPT], req_i[GENERATED], req_i[COMPUTED]
    blocks_r, seq, cached = req_i[BLOCKS], req_i[SEQ], req_i[CACHED]
    admit = req_f[ADMIT]
    considered = 0
    exact = -1
    status = SCHEDULED
    while w_head < w_tail and left > 0 and n_run < max_seqs:
        if n_hits >= 0 and considered == n_hits:
            status = MORE_HITS
            break
        rid = waitq[w_head]
        hit = hits[considered] if n_hits >= 0 else 0
        considered += 1
        comp = hit
        if consumer and generated[rid] == 0:
            # the prompt's KV came from the prefill instance: only its last token is computed here
            if prompt[rid] - 1 > comp:
                comp = prompt[rid] - 1
        todo = prompt[rid] + generated[rid] - comp
        c = _chunk(todo, left, thr)
        b = (comp + c + _BT - 1) // _BT
        if dec_bound - pre_blocks < b:
            if exact < 0:
                exact = _dec_blocks_exact(I, n_dec, lookahead)
            if total_blocks - pre_blocks - exact < b:
                break
        cached[rid] = hit
        computed[rid] = comp
        w_head += 1
        pre_blocks += b
        blocks_r[rid] = b
        if admit[rid] != admit[rid]:  # (NaN: first admission)
            admit[rid] = now
        admit_seq += 1
        seq[rid] = admit_seq
        pre[n_pre] = rid
        chunks[n_pre] = c
        n_pre += 1
        if c == todo:
            n_pre_sample += 1
        left -= c
        kv_pre += comp + c
        n_run += 1
    return status, n_pre, w_head, pre_blocks, admit_seq, left, n_pre_sample, kv_pre, considered


@njit(cache=True)
def schedule_step(req_i, req_f, pre, n_pre, chunks, waitq, w_head, w_tail, hits, n_hits, I, n_dec, K, lookahead,
                  kv_dec, total_blocks, pre_blocks, budget, thr, max_seqs, admit, consumer, admit_seq,
                  now):  # fmt: skip
    """One step's prefill schedule: the running prefills pre[:n_pre] take their chunks from the
    budget left after n_dec decode slots' 1 + K reservations (chunks[:n_pre]), their KV grows,
    and, where admit, ``admit_waiting`` admits from the waiting queue. Where the grown blocks do
    not fit (the decode slots' exact count), nothing is written: status PREEMPT (the caller
    preempts the running queue's tail and schedules again, without admission). Returns (status,
    the running prefills' tokens, n_pre, w_head, pre_blocks, admit_seq, prefill tokens, prefills
    sampling a token (chunk ends the prompt), KV tokens the prefills read, candidates
    considered)."""
    prompt, generated, computed, blocks_r = req_i[PROMPT], req_i[GENERATED], req_i[COMPUTED], req_i[BLOCKS]
    left = budget - n_dec * (1 + K)
    if left < 0:
        left = 0
    n_pre_sample = np.int64(0)  # (typed int64 from the start: see "Literal arguments" above)
    kv_pre = np.int64(0)
    run_tokens = 0
    grow = 0
    for i in range(n_pre):
        r = pre[i]
        comp = computed[r]
        todo = prompt[r] + generated[r] - comp
        c = _chunk(todo, left, thr)
        chunks[i] = c
        if c > 0 and c == todo:
            n_pre_sample += 1
        left -= c
        run_tokens += c
        kv_pre += comp + c
        g = (comp + c + _BT - 1) // _BT - blocks_r[r]
        if g > 0:
            grow += g
    # the decode slots' blocks: sum ceil(x / 16) <= (sum x + 15 n) / 16 first (they do not change
    # while planning), exactly only where that bound leaves too little
    dec_bound = total_blocks - (kv_dec + n_dec * (lookahead + _BT - 1)) // _BT
    if dec_bound - pre_blocks < grow:
        if total_blocks - pre_blocks - _dec_blocks_exact(I, n_dec, lookahead) < grow:
            return PREEMPT, run_tokens, n_pre, w_head, pre_blocks, admit_seq, run_tokens, n_pre_sample, kv_pre, 0
    for i in range(n_pre):
        r = pre[i]
        g = (computed[r] + chunks[i] + _BT - 1) // _BT - blocks_r[r]
        if g > 0:
            blocks_r[r] += g
    pre_blocks += grow
    status = SCHEDULED
    considered = 0
    if admit and w_head < w_tail and left > 0:
        status, n_pre, w_head, pre_blocks, admit_seq, left, n_pre_sample, kv_pre, considered = admit_waiting(
            req_i, req_f, pre, n_pre, chunks, waitq, w_head, w_tail, hits, n_hits, I, n_dec, lookahead, dec_bound,
            total_blocks, pre_blocks, left, n_dec + n_pre, max_seqs, thr, consumer, admit_seq, now, n_pre_sample,
            kv_pre,
        )  # fmt: skip
    pre_tokens = 0
    for i in range(n_pre):
        pre_tokens += chunks[i]
    return status, run_tokens, n_pre, w_head, pre_blocks, admit_seq, pre_tokens, n_pre_sample, kv_pre, considered


@njit(cache=True)
def plan_general(req_i, req_f, pre, n_pre, chunks, waitq, w_head, w_tail, hits, n_hits, I, X, n_dec, K, lookahead,
                 kv_dec, total_blocks, pre_blocks, budget, thr, max_seqs, admit, consumer, admit_seq, now, key, head,
                 draw_f, adaptive, code, tau, cp, cp2, mode, dense, kv_ms_per_tok, row_extra_ms, ctx_ms_per_tok,
                 pre_mode, pre_coef, row_buf, conf, lead, verified, cap):  # fmt: skip
    """``schedule_step``, then (n_dec and K > 0 decode slots) ``plan_decodes`` of one step,
    adaptive budgets priced by the engine's cost row of n_dec + the running prefills' tokens
    (N): row[b] = dense[N + b] + (kv_ms_per_tok x (kv_dec + n_dec) + row_extra_ms), b = 0..M,
    M = min(max(budget - N, 0), n_dec K) (CostModel.step_cost_row's values; row_extra_ms: drafter
    and CPU overhead), built in row_buf, the running prefills' prefill_ms (CostModel.prefill_args'
    pre_mode, pre_coef) beside it for every budget. draw_f: the draws' five float parameters (token, step,
    head noise and bias scales, temperature). No draws where the schedule preempts (PREEMPT), or
    where the row runs past the dense table: then the caller prices and draws itself
    (``dsim.kernels_step.plan_decodes``, the same function). Returns schedule_step's tuple, then
    whether the slots were drawn and the drafts verified (0 without draws)."""
    n_run = n_pre
    st, run_tokens, n_pre, w_head, pre_blocks, admit_seq, pre_tokens, n_sampling, kv_pre, seen = schedule_step(
        req_i, req_f, pre, n_pre, chunks, waitq, w_head, w_tail, hits, n_hits, I, n_dec, K, lookahead, kv_dec,
        total_blocks, pre_blocks, budget, thr, max_seqs, admit, consumer, admit_seq, now,
    )  # fmt: skip
    v0 = 0
    if st == PREEMPT or n_dec == 0 or K == 0:
        return st, run_tokens, n_pre, w_head, pre_blocks, admit_seq, pre_tokens, n_sampling, kv_pre, seen, False, v0
    N = n_dec + run_tokens
    row = row_buf[:0]
    if adaptive:
        M = budget - N
        if M < 0:
            M = 0
        if M > n_dec * K:
            M = n_dec * K
        if N + M + 1 > len(dense):  # (the status may be MORE_HITS: admission goes on)
            return st, run_tokens, n_pre, w_head, pre_blocks, admit_seq, pre_tokens, n_sampling, kv_pre, seen, False, v0
        c = kv_ms_per_tok * float(kv_dec + n_dec) + row_extra_ms
        for b in range(M + 1):
            row_buf[b] = dense[N + b] + c
        row = row_buf[: M + 1]
    # (the budget priced with the running prefills' chunks only, as Replica._plan_step prices it)
    extra = prefill_ms_compiled(pre_mode, pre_coef, chunks, req_i[COMPUTED], pre, n_run) if adaptive else 0.0
    v0, _ = plan_decodes(
        key, I, X, n_dec, K, np.int64(1), head, draw_f[0], draw_f[1], draw_f[2], draw_f[3], draw_f[4], adaptive, code, tau, cp,
        cp2, row, extra, ctx_ms_per_tok, N, budget, mode, conf, lead, verified, cap,
    )  # fmt: skip
    return st, run_tokens, n_pre, w_head, pre_blocks, admit_seq, pre_tokens, n_sampling, kv_pre, seen, True, v0


@njit(cache=True, inline="always")
def commit_prefills(req_i, req_f, pre, n_pre, chunks, t_now, moved, late):
    """After a step: each running prefill pre[i] computed chunks[i] tokens; one whose computed
    tokens reach prompt + generated samples a token and becomes a decode slot: moved[6 m : 6 m + 6]
    = (request id, KV tokens = computed, generated before, its held spec counters, then zeroed),
    its blocks released (the slot counts them from its KV tokens), generated + 1; a resumed one
    (generated before > 0) also emits: its gap since its last emission in late[k] (ms), its largest
    ITL and emission count updated. The rest stay in pre, in order. Returns (new slots m, blocks
    released, their KV tokens, prefills left, resumed gaps k)."""
    prompt, generated, computed, blocks_r = req_i[PROMPT], req_i[GENERATED], req_i[COMPUTED], req_i[BLOCKS]
    emits = req_i[EMITTED]
    itl_max, last_emit = req_f[ITL_MAX], req_f[LAST_EMIT]
    m = 0
    freed = 0
    kv = 0
    k = 0
    w = 0
    for i in range(n_pre):
        r = pre[i]
        c = chunks[i]
        if c > 0:
            cp = computed[r] + c
            computed[r] = cp
            g = generated[r]
            if cp == prompt[r] + g:
                if g:  # resumed after a preemption
                    gap = (t_now - last_emit[r]) * 1000.0
                    late[k] = gap
                    k += 1
                    if gap > itl_max[r]:  # (Python's max(itl_max, gap): the first unless larger)
                        itl_max[r] = gap
                    emits[r] += 1
                generated[r] = g + 1
                o = 6 * m
                moved[o] = r
                moved[o + 1] = cp
                moved[o + 2] = g
                moved[o + 3] = req_i[HELD_ROUNDS, r]
                moved[o + 4] = req_i[HELD_ACCEPTED, r]
                moved[o + 5] = req_i[HELD_VERIFIED, r]
                req_i[HELD_ROUNDS, r] = 0
                req_i[HELD_ACCEPTED, r] = 0
                req_i[HELD_VERIFIED, r] = 0
                m += 1
                freed += blocks_r[r]
                blocks_r[r] = 0
                kv += cp
                continue
        pre[w] = r
        w += 1
    return m, freed, kv, w, k


@njit(cache=True)
def commit_step(I, F, X, n, K, verified, cap, lead, given, hist, itl_ms, slot_out, step_out, conf, cp, cp2,
                itl_mode, t_now, prev_end, V, j, pre, n_pre, chunks, moved, late, req_i, req_f, slot_rows, left_lb,
                done_I, done_F, d0):  # fmt: skip
    """A general step's commit in one call, in the order its effects happen: ``commit_prefills``
    of the n_pre running prefills (their new slots' rows into moved, resumed requests' gaps into
    late); ``commit_decodes`` of the n decode slots (one step; nothing when n = 0), then, for
    itl_mode 1 or 2, the ITL samples of the slots that emitted (given[r] != 0), written into V
    [2, rows] from row j (gap = (t_now - last emission) x 1000, count 1), and their largest ITL,
    last emission and emission count (itl_mode 2 first sets every slot's last emission to
    prev_end; itl_mode 0: commit_decodes' itl_ms did this); then ``new_slots`` for the m
    prefills that ended (the caller has grown the slot buffers to n + n_pre); then, where the
    smallest remaining output (the commit's, else left_lb, lowered by the new slots') is not
    positive, ``remove_done`` into the done rows from d0. Returns (verified, accepted,
    full-block accepted, emitted by the decodes, slots live, slots removed, smallest remaining
    output or a lower bound, KV tokens removed, new slots m, prefill blocks released, the new
    slots' KV tokens, prefills left, resumed gaps)."""
    m = np.int64(0)
    freed = kv_new = n_late = 0
    w_pre = n_pre
    if n_pre > 0:
        m, freed, kv_new, w_pre, n_late = commit_prefills(req_i, req_f, pre, n_pre, chunks, t_now, moved, late)
    vt = at = lt = et = 0
    ml = left_lb
    if n > 0:
        vt, at, lt, et, ml = commit_decodes(
            I, F, n, np.int64(1), K, verified, cap, lead, given, hist, itl_ms, slot_out, step_out, X, conf, cp, cp2
        )
        if itl_mode > 0:
            k = j
            for r in range(n):
                if itl_mode == 2:
                    F[r, 0] = prev_end
                if given[r] == 0:  # (given: -1 where the budget cut nothing)
                    continue
                gap = (t_now - F[r, 0]) * 1000.0
                V[0, k] = gap
                V[1, k] = 1.0
                k += 1
                if gap > F[r, 1] or gap != gap:  # (np.maximum: the larger, NaN propagating)
                    F[r, 1] = gap
                F[r, 0] = t_now
                I[r, EMITS] += 1
    if m > 0:
        lm = new_slots(I, F, X, n, moved, m, t_now, req_i[PROMPT], req_i[OUTPUT], req_i[CLASS], req_i[EMITTED],
                       req_f[ITL_MAX], req_f[FIRST_TOKEN], req_f[LAST_EMIT], slot_rows)  # fmt: skip
        if lm < ml:
            ml = lm
    w = n + m
    d = 0
    done_kv = 0
    if w > 0 and ml <= 0:
        w, d, ml, done_kv = remove_done(I, F, X, w, done_I, done_F, d0, t_now)
    return vt, at, lt, et, w, d, ml, done_kv, m, freed, kv_new, w_pre, n_late


# ---- consecutive general steps of one replica, up to its next outside event -------------------

# run_general_steps' replica state (int64 st[...], float64 stf[...]), read and written back.
S_N, S_NPRE, S_WHEAD, S_WTAIL, S_KVDEC, S_PREBLOCKS, S_ADMITSEQ, S_LEFTLB, S_DONEN, S_LASTPREV = range(10)
S_NSTEPS, S_BATCHSUM, S_SROW, S_VROW, S_NEXTID, S_HEADN, S_PENDING = range(10, 17)
STATE_LEN = 17
F_NOW, F_PREV_END = range(2)
# its static parameters (int64 pi[...], float64 pf[...])
(P_K, P_LOOKAHEAD, P_TOTAL_BLOCKS, P_BUDGET, P_THR, P_MAX_SEQS, P_CONSUMER, P_HEAD, P_ADAPTIVE, P_CODE,
 P_CP, P_CP2, P_MODE, P_LIMIT, P_REPLICA, P_HEAD_CAP, P_TERMS, P_PRE_MODE, P_CTX) = range(19)  # fmt: skip
PARAMS_LEN = 19
PF_TAU, PF_KV_MS_PER_TOK, PF_CTX_MS_PER_TOK, PF_CPU_MS, PF_SLOPE = range(5)
# its stats accumulators (int64): the speculative counters _account adds
T_DRAFTS, T_DRAFT_TOKENS, T_VERIFIED, T_IN_WINDOW, T_FULL_BLOCK = range(5)
# why it stopped
(STOP_WINDOW, STOP_IDLE, STOP_PYTHON, STOP_PLANNED, STOP_FINISHED, STOP_ROOM) = range(6)  # fmt: skip
# the successors of finished requests: submitted here (a closed loop's users on this replica),
# none (an open loop: arrivals are the simulation's), or by the simulation (stop after the step)
SUCC_SELF, SUCC_NONE, SUCC_PYTHON = range(3)


@njit(cache=True, inline="always")
def _decodes_run(n, cut, given):
    """The decode slots that run a step: all n, or where the budget cut the queue those it gave
    some tokens (given[r] != 0)."""
    if not cut:
        return n
    k = 0
    for r in range(n):
        if given[r] != 0:
            k += 1
    return k


@njit(cache=True, inline="always")
def _forward_ms(n, below, ax, ams, slope, limit):
    """CostModel.step_ms_one's forward part for n tokens (the capture table up to its limit,
    interpolated above it, the last slope past the table), in its operations' order."""
    if n <= limit:
        return below[n]
    last = ax.shape[0] - 1
    if n >= ax[last]:
        return ams[last] + slope * (n - ax[last])
    i = np.searchsorted(ax, n, side="right")  # ax[i-1] <= n < ax[i]
    x0 = ax[i - 1]
    return ams[i - 1] + (ams[i] - ams[i - 1]) * (n - x0) / (ax[i] - x0)


@njit(cache=True)
def run_general_steps(req_i, req_f, pre, chunks, waitq, I, F, X, slot_rows, moved, late, done_I, done_F, hist,
                      slot_out, step_out, no_cut, no_steps, no_conf, st, stf, pi, pf, key, draw_f, dense, row_buf,
                      below, ax, ams, draft_tab, S, s_cap, V, v_cap, tot, head_conf, head_acc, arrival, replica_of,
                      t_next, successors, pre_coef, cx_i, cx_f, cx_rb, cx_rq, cx_rc, cx_tab, cx_share,
                      cx_step, p_conf, p_lvc, p_given, p_i, p_f):  # fmt: skip
    """The engine's general steps of one replica (Replica._plan_step, then _commit_step, then the
    loop's next checks), one after another, for as long as each step ends strictly before
    t_next (the next outside event; as Replica._skip) and none needs Python: stops before a
    step where a decode window can run (STOP_WINDOW), the replica is idle (STOP_IDLE), a
    buffer lacks room (STOP_ROOM: the caller makes room and calls again) or the schedule
    preempts (STOP_PYTHON: nothing of that step written, the caller runs it), after planning a
    step that does not end before t_next (STOP_PLANNED: its draws and scalars returned for the
    caller to wait and commit), or after a step that finished requests whose successors the
    simulation submits (STOP_FINISHED). Preconditions
    (the caller's): the fused plan's (an engine cost row, no prefill terms, a token budget
    inside the dense table), no prefix caching, shapes or draft script, slot buffers for
    max_num_seqs slots. A step's records go to S (the step table's block, rows st[S_SROW] ..
    s_cap) and V (the ITL samples' block); the counters to tot; while the confidence head's
    sample has fewer than pi[P_HEAD_CAP] drafts (0: no head), each step's first drafts'
    confidences and outcomes (request by request, as Replica._account takes them) to
    head_conf / head_acc from st[S_HEADN].
    With pi[P_TERMS] (a profile with prefill or per-request attention terms) a step's forward
    also carries its prefill chunks' CostModel.prefill_ms (CostModel.prefill_args: pi[P_PRE_MODE],
    pre_coef) and, with pi[P_CTX], its decodes' per-request attention (CostModel.context_ms of
    their windows, the budget's cut where it cut, from CostModel.context_args packed as cx_i ..
    cx_step), as Replica._plan_step adds them.
    With st[S_PENDING] the call first commits the step it planned before (STOP_PLANNED's), now
    that the caller has waited until its end (stf[F_NOW]): its draws and scalars as p_conf,
    p_lvc, p_given, p_i (cut, tokens, prefill tokens, KV tokens, prefills with a chunk) and p_f
    (forward, duration ms); st[S_PENDING] is 0 once it is committed (a STOP_ROOM before that
    leaves it pending).
    Returns (stop, conf, lvc, given, cut, n_tokens, prefill tokens, KV tokens, forward ms,
    duration ms, prefills with a chunk, finished rows from)."""
    K = pi[P_K]
    budget = pi[P_BUDGET]
    max_seqs = pi[P_MAX_SEQS]
    adaptive = pi[P_ADAPTIVE] != 0
    cp_raw = pi[P_CP]
    cp = cp_raw if cp_raw >= 0 else 0
    cpu_ms = pf[PF_CPU_MS]
    N_req = arrival.shape[0]
    conf = no_conf
    lvc = np.empty((3, 1, 0), np.int64)
    given = no_cut
    pending = st[S_PENDING] != 0
    while True:
        n = st[S_N]
        n_run0 = st[S_NPRE]
        w_head, w_tail = st[S_WHEAD], st[S_WTAIL]
        s_i, v_j, d0 = st[S_SROW], st[S_VROW], st[S_DONEN]
        if not pending and n == 0 and n_run0 == 0 and w_head == w_tail:
            return STOP_IDLE, conf, lvc, given, False, 0, 0, 0, 0.0, 0.0, 0, d0
        last_prev = st[S_LASTPREV] != 0
        if not pending and n > 0 and n_run0 == 0 and not (w_head < w_tail and n < max_seqs) and n * (1 + K) <= budget:
            ok = last_prev
            if not ok:
                lo = F[0, 0]
                for r in range(1, n):
                    if F[r, 0] < lo:
                        lo = F[r, 0]
                ok = not (lo < stf[F_PREV_END])
            if ok:
                return STOP_WINDOW, conf, lvc, given, False, 0, 0, 0, 0.0, 0.0, 0, d0
        if (s_i >= s_cap or v_j + max_seqs + 2 > v_cap or d0 + max_seqs > done_I.shape[0]
                or w_tail + max_seqs > waitq.shape[0]):  # fmt: skip
            return STOP_ROOM, conf, lvc, given, False, 0, 0, 0, 0.0, 0.0, 0, d0
        if pending:  # the step planned before the caller's wait: its commit first
            pending = False
            st[S_PENDING] = 0
            conf, lvc, given = p_conf, p_lvc, p_given
            cut = p_i[0] != 0
            n_tokens, pre_tokens, kv, n_chunked = p_i[1], p_i[2], p_i[3], p_i[4]
            fwd, dur = p_f[0], p_f[1]
            n_pre = st[S_NPRE]
            kv_dec = st[S_KVDEC]
            t_end = stf[F_NOW]  # (the caller waited until the step's end)
            n_run = _decodes_run(n, cut, given)
        else:
            now = stf[F_NOW]
            kv_dec = st[S_KVDEC]
            if K > 0 and n > 0:
                conf = np.empty((1, K, n), np.float32)
                lvc = np.empty((3, 1, n), np.int64)
                sched_st, run_tokens, n_pre, w_head, pre_blocks, admit_seq, pre_tokens, n_sampling, kv_pre, seen, drawn, v0 = (
                    plan_general(
                        req_i, req_f, pre, n_run0, chunks, waitq, w_head, w_tail, no_cut, np.int64(-1), I, X, n, K,
                        pi[P_LOOKAHEAD], kv_dec, pi[P_TOTAL_BLOCKS], st[S_PREBLOCKS], budget, pi[P_THR], max_seqs,
                        np.bool_(True),
                        pi[P_CONSUMER] != 0, st[S_ADMITSEQ], now, key, pi[P_HEAD], draw_f, adaptive, pi[P_CODE],
                        pf[PF_TAU], cp, pi[P_CP2], pi[P_MODE], dense, pf[PF_KV_MS_PER_TOK], cpu_ms + draft_tab[n],
                        pf[PF_CTX_MS_PER_TOK], pi[P_PRE_MODE], pre_coef, row_buf, conf, lvc[0], lvc[1], lvc[2],
                    )
                )  # fmt: skip
            else:
                conf = no_conf
                lvc = np.empty((3, 1, 0), np.int64)
                v0 = 0
                sched_st, run_tokens, n_pre, w_head, pre_blocks, admit_seq, pre_tokens, n_sampling, kv_pre, seen = (
                    schedule_step(
                        req_i, req_f, pre, n_run0, chunks, waitq, w_head, w_tail, no_cut, np.int64(-1), I, n, K,
                        pi[P_LOOKAHEAD], kv_dec, pi[P_TOTAL_BLOCKS], st[S_PREBLOCKS], budget, pi[P_THR], max_seqs,
                        np.bool_(True),
                        pi[P_CONSUMER] != 0, st[S_ADMITSEQ], now,
                    )
                )  # fmt: skip
            if sched_st == PREEMPT:  # (nothing written: the caller preempts and schedules)
                return STOP_PYTHON, conf, lvc, given, False, 0, 0, 0, 0.0, 0.0, 0, d0
            st[S_NPRE], st[S_WHEAD], st[S_PREBLOCKS], st[S_ADMITSEQ] = n_pre, w_head, pre_blocks, admit_seq
            # the decodes' tokens; the budget cuts the decode queue where they exceed it (rare)
            dec_tokens = 0
            cut = False
            given = no_cut
            if n > 0:
                dec_tokens = n + v0 if K > 0 else n
                if dec_tokens > budget:
                    given = np.empty(n, np.int64)
                    before = 0
                    for r in range(n):
                        q = 1 + lvc[1, 0, r] if K > 0 else 1
                        g = budget - before
                        if g < 0:
                            g = 0
                        given[r] = q if q < g else g
                        before += q
                    dec_tokens = budget
                    cut = True
            n_tokens = dec_tokens + pre_tokens
            n_chunked = n_pre
            if n_run0 and chunks[n_run0 - 1] == 0:
                n_chunked = 0
                for i in range(n_pre):
                    if chunks[i] != 0:
                        n_chunked += 1
            if n_tokens == 0:  # (nothing scheduled, nothing written: the caller waits for an event)
                return STOP_PYTHON, conf, lvc, given, False, 0, 0, 0, 0.0, 0.0, 0, d0
            kv = kv_dec + dec_tokens + kv_pre
            n_run = _decodes_run(n, cut, given)
            n_sample = n_run + n_sampling
            fwd = _forward_ms(n_tokens, below, ax, ams, pf[PF_SLOPE], pi[P_LIMIT]) + pf[PF_KV_MS_PER_TOK] * kv
            if pi[P_TERMS]:  # (Replica._plan_step's order: forward, then prefill, then attention terms)
                pre_ms = prefill_ms_compiled(pi[P_PRE_MODE], pre_coef, chunks, req_i[COMPUTED], pre, n_pre)
                ctx_ms = 0.0
                if pi[P_CTX] and n > 0:
                    ctx_q = np.empty(n, np.int64)
                    ctx_c = np.empty(n, np.int64)
                    m_q = 0
                    for r in range(n):
                        if cut:  # (the budget's tokens, the requests it gave some)
                            if given[r] > 0:
                                ctx_q[m_q] = given[r]
                                ctx_c[m_q] = I[r, COMP]
                                m_q += 1
                        else:
                            ctx_q[m_q] = 1 + lvc[1, 0, r] if K > 0 else 1
                            ctx_c[m_q] = I[r, COMP]
                            m_q += 1
                    if m_q > 0:
                        ctx_ms = _context_ms_packed(ctx_q[:m_q], ctx_c[:m_q], cx_i, cx_f, cx_rb, cx_rq, cx_rc, cx_tab,
                                                    cx_share, cx_step)  # fmt: skip
                fwd = fwd + pre_ms + ctx_ms
            dur = fwd + (draft_tab[n_sample] if K > 0 and n_sample > 0 else 0.0) + cpu_ms
            t_end = now + dur / 1000.0
            if not t_next > t_end:  # an outside event first: the caller waits, then commits
                return STOP_PLANNED, conf, lvc, given, cut, n_tokens, pre_tokens, kv, fwd, dur, n_chunked, d0
        # ---- the commit (as Replica._commit_step) ----
        stf[F_NOW] = t_end
        itl_mode = 0
        itl_ms = -1.0
        jpos = 0
        if n > 0:
            if not cut and last_prev:
                itl_ms = dur
                V[0, v_j] = dur
                V[1, v_j] = n
                v_j += 1
            else:
                itl_mode = 2 if last_prev else 1
                jpos = v_j
                v_j += n_run
                st[S_LASTPREV] = 0 if cut else 1
        if K > 0 and n > 0:
            vr, cr, lr, cf = lvc[1], lvc[2], lvc[0], conf
        else:
            vr, cr, lr, cf = no_steps, no_steps, no_steps, no_conf
        vt, at, lt, et, w, d, ml, done_kv, m, freed, kv_new, w_pre, n_late = commit_step(
            I, F, X, n, K, vr, cr, lr, given, hist, itl_ms, slot_out, step_out, cf, cp_raw, pi[P_CP2], itl_mode,
            t_end, stf[F_PREV_END], V, jpos, pre, n_pre, chunks, moved, late, req_i, req_f, slot_rows,
            st[S_LEFTLB], done_I, done_F, d0,
        )  # fmt: skip
        st[S_NPRE] = w_pre
        if n_pre > 0:
            st[S_PREBLOCKS] -= freed
            kv_dec += kv_new
            for q in range(n_late):
                V[0, v_j] = late[q]
                V[1, v_j] = 1.0
                v_j += 1
        if n > 0:
            if K > 0:
                tot[T_DRAFTS] += n
                tot[T_DRAFT_TOKENS] += n * K
                tot[T_VERIFIED] += vt
                if adaptive:
                    tot[T_IN_WINDOW] += at
                    tot[T_FULL_BLOCK] += lt
                h = st[S_HEADN]
                if h < pi[P_HEAD_CAP]:
                    q = (pi[P_HEAD_CAP] - h + K - 1) // K
                    if q > n:
                        q = n
                    for r in range(q):
                        for j in range(K):
                            head_conf[h] = conf[0, j, r]
                            head_acc[h] = j < lvc[0, 0, r]
                            h += 1
                    st[S_HEADN] = h
            kv_dec += et
        st[S_LEFTLB] = ml
        st[S_KVDEC] = kv_dec - done_kv
        st[S_N] = w
        st[S_DONEN] = d0 + d
        stf[F_PREV_END] = t_end
        n_req = n_run + n_chunked
        st[S_NSTEPS] += 1
        st[S_BATCHSUM] += n_req
        S[SC_REPLICA, s_i] = pi[P_REPLICA]
        S[SC_T_END, s_i] = t_end
        S[SC_DURATION, s_i] = dur
        S[SC_REQUESTS, s_i] = n_req
        S[SC_DECODE, s_i] = n_run
        S[SC_TOKENS, s_i] = n_tokens
        S[SC_PREFILL, s_i] = pre_tokens
        S[SC_VERIFIED, s_i] = vt
        S[SC_ACCEPTED, s_i] = at
        S[SC_EMITTED, s_i] = et + m
        S[SC_KV, s_i] = kv
        S[SC_WAITING, s_i] = st[S_WTAIL] - st[S_WHEAD]
        st[S_SROW] = s_i + 1
        st[S_VROW] = v_j
        if d > 0:
            if successors == SUCC_PYTHON:
                return STOP_FINISHED, conf, lvc, given, False, 0, 0, 0, 0.0, 0.0, 0, d0
            if successors == SUCC_SELF:  # the finished users' next requests, arriving now
                i0 = st[S_NEXTID]
                i1 = i0 + d if i0 + d < N_req else N_req
                tail = st[S_WTAIL]
                for rid in range(i0, i1):
                    arrival[rid] = t_end
                    replica_of[rid] = pi[P_REPLICA]
                    waitq[tail] = rid
                    tail += 1
                st[S_WTAIL] = tail
                if i1 > i0:
                    st[S_NEXTID] = i1
