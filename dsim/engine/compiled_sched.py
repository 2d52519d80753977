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
  (``dsim.engine.compiled_decode.plan_decodes``) priced by the engine's cost row of the step, in one call;
* ``commit_step``: after the step, in the order its effects happen: ``commit_prefills`` (the
  chunks computed; the prefills whose chunk ended their prompt sample a token and leave the
  queue as new decode slots, a resumed request's ITL gap noted), the decode slots' commit
  (``dsim.engine.compiled_decode.commit_decodes``) and ITL samples, the new slots
  (``dsim.engine.compiled_decode.new_slots``) and the removal of finished slots.

Consecutive general steps of one replica as one call (the above, the step's duration, its records
and counters) are ``dsim.engine.compiled_general_steps.run_general_steps``'s.

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

from typing import NamedTuple

import numpy as np
from numba import njit

from dsim.cost import KV_BLOCK_TOKENS, prefill_ms_compiled
from dsim.engine.compiled_bundles import (
    COMP,
    EMITS,
    PolicyParams,
    RequestColumns,
    SlotTable,
)
from dsim.engine.compiled_decode import commit_decodes, new_slots, plan_decodes, remove_done

# Rows of Requests.req_i (int64) and Requests.req_f (float64).
PROMPT, OUTPUT, CLASS, EMITTED, COMPUTED, GENERATED, BLOCKS, SEQ, CACHED, PREEMPTIONS = range(10)
HELD_ROUNDS, HELD_ACCEPTED, HELD_VERIFIED = range(10, 13)  # a preempted request's spec counters
REQ_I_ROWS = 13
ITL_MAX, FIRST_TOKEN, LAST_EMIT, ADMIT = range(4)
REQ_F_ROWS = 4

# schedule_step's status.
SCHEDULED, PREEMPT, MORE_HITS = range(3)

_BT = KV_BLOCK_TOKENS


# ---- the bundles these kernels take (plain tuples from Python: see dsim.engine.compiled_bundles) --


class RequestTable(NamedTuple):
    """The request table (dsim.engine.Requests), every request of the simulation."""

    ints: np.ndarray  # int64 [REQ_I_ROWS, requests]: the rows PROMPT .. HELD_VERIFIED
    floats: np.ndarray  # float64 [REQ_F_ROWS, requests]: the rows ITL_MAX .. ADMIT
    slot_rows: np.ndarray  # float32 [requests, rows]: a decode slot's rows (offsets, kept history)


class Queues(NamedTuple):
    """The replica's prefilling requests and its waiting queue's buffer."""

    prefill_ids: np.ndarray  # int64 [max_num_seqs]: the prefilling requests, queue order (first n_pre)
    chunks: np.ndarray  # int64 [max_num_seqs]: each one's chunk this step
    waiting: np.ndarray  # int64: the waiting queue's buffer, live from its head to its tail


class SchedLimits(NamedTuple):
    """A replica's scheduler limits (EngineConfig, the KV cache), fixed for the run."""

    k: int  # drafts a decode slot reserves (K; 0 without speculation)
    lookahead: int  # 1 + K: the slots a decode allocates beyond its KV tokens
    total_blocks: int  # the KV cache's blocks
    token_budget: int  # max_num_batched_tokens
    chunk_cap: int  # long_prefill_token_threshold (0: none)
    max_seqs: int  # max_num_seqs
    kv_consumer: bool  # a decode instance: the prompt's KV computed elsewhere


class SchedStep(NamedTuple):
    """One step's scheduler state (what schedule_step and admit_waiting read)."""

    n_pre: int  # prefilling requests
    w_head: int  # the waiting queue's head and tail in Queues.waiting
    w_tail: int
    n_dec: int  # decode slots
    kv_dec: int  # their KV tokens
    pre_blocks: int  # KV blocks the prefilling requests hold
    admit_seq: int  # admissions so far (the admission number of the last)
    now: float  # the step's start (s)
    admit: bool  # admission allowed (not after a preemption this step)
    hits: np.ndarray  # int64: the next waiting requests' prefix-cache hit tokens
    n_hits: int  # how many hits are looked up (-1: no prefix cache)


class CommitStep(NamedTuple):
    """A general step's scalars for its commit (commit_step)."""

    n_pre: int  # prefilling requests this step (their chunks in Queues.chunks)
    itl_mode: int  # 0: one run-length ITL sample (itl_ms); 1: a sample per slot; 2: the same, every
    #                slot's last emission first set to prev_end
    itl_ms: float  # the step's duration where itl_mode is 0, else -1
    t_now: float  # the step's end (s)
    prev_end: float  # the previous step's end (s)
    itl: np.ndarray  # float64 [2, rows]: the ITL samples' block (gap ms, count)
    itl_row: int  # its first free row
    left_lb: int  # a lower bound on the decode slots' smallest remaining output
    moved: np.ndarray  # int64 [6 max_num_seqs]: the prefills that became decode slots (commit_prefills)
    late: np.ndarray  # float64 [max_num_seqs]: resumed requests' ITL gaps (ms)
    done_ints: np.ndarray  # int64 [rows, NCOL]: removed slots' int rows (remove_done)
    done_floats: np.ndarray  # float64 [rows, 3]: their last emission, largest ITL, finish time
    done_from: int  # the first free row of done_ints / done_floats


class RowPricing(NamedTuple):
    """The engine's cost row of an adaptive budget, built in the kernel (plan_general)."""

    dense: np.ndarray  # CostModel.forward_table()
    kv_ms_per_tok: float
    pre_mode: int  # CostModel.prefill_args(): the prefill terms' kind
    pre_coef: np.ndarray  # and coefficients
    row_buf: np.ndarray  # float64 [max_num_batched_tokens + 1]: where the row is built


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
def admit_waiting(requests, queues, slots, limits, step, dec_bound, left, n_run, n_pre_sample, kv_pre):
    """FCFS admission from the waiting queue (step: a SchedStep; requests, queues, slots, limits:
    a RequestTable, Queues, SlotTable, SchedLimits) while left > 0 tokens, n_run < max_seqs and the
    request's blocks fit (dec_bound: total blocks less the decode slots' bound; the exact count
    only where it fails). n_hits < 0: no prefix cache (every hit 0); else hits[k] is the k-th
    candidate's cached prompt tokens, and admission stops after n_hits candidates (MORE_HITS: the
    caller looks up the next ones and calls again). An admitted request gets its computed tokens
    (hit, or for a KV consumer's first admission prompt - 1), blocks, admission time (first
    admission), admission number and chunk (pre[n_pre], chunks[n_pre]). Returns (status, n_pre,
    w_head, pre_blocks, admit_seq, left, n_pre_sample, kv_pre, candidates considered: the
    admitted plus a refused one)."""
    req, q, lim, st = RequestTable(*requests), Queues(*queues), SchedLimits(*limits), SchedStep(*step)
    req_i, req_f, I = req.ints, req.floats, SlotTable(*slots).ints
    pre, chunks, waitq = q.prefill_ids, q.chunks, q.waiting
    n_pre, w_head, w_tail, n_dec, pre_blocks, admit_seq, now = (
        st.n_pre, st.w_head, st.w_tail, st.n_dec, st.pre_blocks, st.admit_seq, st.now
    )  # fmt: skip
    hits, n_hits = st.hits, st.n_hits
    lookahead, total_blocks, max_seqs, thr, consumer = (
        lim.lookahead, lim.total_blocks, lim.max_seqs, lim.chunk_cap, lim.kv_consumer
    )  # fmt: skip
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
def schedule_step(requests, queues, slots, limits, step):
    """One step's prefill schedule (step: a SchedStep; requests, queues, slots, limits: a
    RequestTable, Queues, SlotTable, SchedLimits): the running prefills pre[:n_pre] take their chunks from the
    budget left after n_dec decode slots' 1 + K reservations (chunks[:n_pre]), their KV grows,
    and, where admit, ``admit_waiting`` admits from the waiting queue. Where the grown blocks do
    not fit (the decode slots' exact count), nothing is written: status PREEMPT (the caller
    preempts the running queue's tail and schedules again, without admission). Returns (status,
    the running prefills' tokens, n_pre, w_head, pre_blocks, admit_seq, prefill tokens, prefills
    sampling a token (chunk ends the prompt), KV tokens the prefills read, candidates
    considered)."""
    req, q, lim, st = RequestTable(*requests), Queues(*queues), SchedLimits(*limits), SchedStep(*step)
    req_i, I = req.ints, SlotTable(*slots).ints
    pre, chunks = q.prefill_ids, q.chunks
    n_pre, w_head, w_tail, n_dec, kv_dec, pre_blocks = (
        st.n_pre,
        st.w_head,
        st.w_tail,
        st.n_dec,
        st.kv_dec,
        st.pre_blocks,
    )
    admit_seq, admit = st.admit_seq, st.admit
    K, lookahead, total_blocks, budget, thr = lim.k, lim.lookahead, lim.total_blocks, lim.token_budget, lim.chunk_cap
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
        step2 = (n_pre, w_head, w_tail, n_dec, kv_dec, pre_blocks, admit_seq, st.now, admit, st.hits, st.n_hits)
        status, n_pre, w_head, pre_blocks, admit_seq, left, n_pre_sample, kv_pre, considered = admit_waiting(
            requests, queues, slots, limits, step2, dec_bound, left, n_dec + n_pre, n_pre_sample, kv_pre
        )
    pre_tokens = 0
    for i in range(n_pre):
        pre_tokens += chunks[i]
    return status, run_tokens, n_pre, w_head, pre_blocks, admit_seq, pre_tokens, n_pre_sample, kv_pre, considered


@njit(cache=True)
def plan_general(requests, queues, slots, limits, step, draws, policy, pricing, row_extra_ms, plan):
    """``schedule_step``, then (n_dec and K > 0 decode slots) ``plan_decodes`` of one step (draws,
    policy, plan: a DrawParams, PolicyParams, DecodePlan), adaptive budgets priced by the engine's
    cost row (pricing: a RowPricing) of n_dec + the running prefills' tokens
    (N): row[b] = dense[N + b] + (kv_ms_per_tok x (kv_dec + n_dec) + row_extra_ms), b = 0..M,
    M = min(max(budget - N, 0), n_dec K) (CostModel.step_cost_row's values; row_extra_ms: drafter
    and CPU overhead), built in row_buf, the running prefills' prefill_ms (CostModel.prefill_args'
    pre_mode, pre_coef) beside it for every budget. No draws where the schedule preempts (PREEMPT), or
    where the row runs past the dense table: then the caller prices and draws itself
    (``dsim.engine.compiled_decode.plan_decodes``, the same function). Returns schedule_step's tuple, then
    whether the slots were drawn and the drafts verified (0 without draws)."""
    step_, lim, pr = SchedStep(*step), SchedLimits(*limits), RowPricing(*pricing)
    n_run, n_dec, kv_dec = step_.n_pre, step_.n_dec, step_.kv_dec
    K, budget = lim.k, lim.token_budget
    adaptive = PolicyParams(*policy).adaptive
    dense, kv_ms_per_tok, row_buf = pr.dense, pr.kv_ms_per_tok, pr.row_buf
    st, run_tokens, n_pre, w_head, pre_blocks, admit_seq, pre_tokens, n_sampling, kv_pre, seen = schedule_step(
        requests, queues, slots, limits, step
    )
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
    q = Queues(*queues)
    extra = (
        prefill_ms_compiled(pr.pre_mode, pr.pre_coef, q.chunks, RequestTable(*requests).ints[COMPUTED], q.prefill_ids, n_run)
        if adaptive
        else 0.0
    )  # fmt: skip
    v0, _ = plan_decodes(slots, n_dec, K, np.int64(1), draws, policy, (row, extra, N, budget), plan)
    return st, run_tokens, n_pre, w_head, pre_blocks, admit_seq, pre_tokens, n_sampling, kv_pre, seen, True, v0


@njit(cache=True, inline="always")
def commit_prefills(req_i, req_f, pre, n_pre, chunks, t_now, moved, late):  # (inlined into commit_step)
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
def commit_step(slots, n, K, plan, given, out, policy, requests, queues, step):
    """A general step's commit in one call (slots, plan, out, policy: a SlotTable, DecodePlan,
    CommitOut, PolicyParams as commit_decodes takes them; requests, queues: a RequestTable,
    Queues; step: a CommitStep, with the prefills' and removed slots' buffers), in the order its
    effects happen: ``commit_prefills``
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
    st, req, q = CommitStep(*step), RequestTable(*requests), Queues(*queues)
    n_pre, itl_mode, itl_ms, t_now, prev_end = st.n_pre, st.itl_mode, st.itl_ms, st.t_now, st.prev_end
    V, j, left_lb, d0 = st.itl, st.itl_row, st.left_lb, st.done_from
    req_i, req_f, pre, chunks = req.ints, req.floats, q.prefill_ids, q.chunks
    sl = SlotTable(*slots)
    I, F = sl.ints, sl.floats
    m = np.int64(0)
    freed = kv_new = n_late = 0
    w_pre = n_pre
    if n_pre > 0:
        m, freed, kv_new, w_pre, n_late = commit_prefills(req_i, req_f, pre, n_pre, chunks, t_now, st.moved, st.late)
    vt = at = lt = et = 0
    ml = left_lb
    if n > 0:
        vt, at, lt, et, ml = commit_decodes(slots, n, np.int64(1), K, plan, given, itl_ms, out, policy)
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
        cols = RequestColumns(
            req_i[PROMPT], req_i[OUTPUT], req_i[CLASS], req_i[EMITTED], req_f[ITL_MAX], req_f[FIRST_TOKEN],
            req_f[LAST_EMIT], req.slot_rows,
        )  # fmt: skip
        lm = new_slots(slots, n, st.moved, m, t_now, cols)
        if lm < ml:
            ml = lm
    w = n + m
    d = 0
    done_kv = 0
    if w > 0 and ml <= 0:
        w, d, ml, done_kv = remove_done(slots, w, st.done_ints, st.done_floats, d0, t_now)
    return vt, at, lt, et, w, d, ml, done_kv, m, freed, kv_new, w_pre, n_late
