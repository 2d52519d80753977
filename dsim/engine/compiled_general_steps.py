"""Consecutive general steps of one replica as one compiled call (numba, nopython, cached on disk;
compiled in a background process where the cache lacks it: dsim.engine.background_compile).

``run_general_steps``: the engine's general steps (dsim.engine.compiled_sched's schedule and
commit, the step's duration, its records and counters, a closed loop's next requests) one after
another, up to the replica's next outside event or the first step that needs Python. The replica
state it reads and writes back is one record (``RUN_STATE``, fields named as ``RunState``'s);
``StepCosts`` prices a step's duration, ``RunBuffers`` holds its outputs; ``STOP_*`` say why a
run stopped, ``SUCC_*`` who submits finished requests' successors.

The calls between kernels pass ``np.int64(...)`` / ``np.bool_(...)``, not literals (the reason:
dsim.engine.compiled_sched's module doc).
"""

from __future__ import annotations

from typing import NamedTuple, get_type_hints

import numpy as np
from numba import njit

from dsim.cost import prefill_ms_compiled
from dsim.engine.compiled_bundles import (
    COMP,
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
    PolicyParams,
    SlotTable,
)
from dsim.engine.compiled_sched import (
    COMPUTED,
    PREEMPT,
    Queues,
    RequestTable,
    RowPricing,
    SchedLimits,
    commit_step,
    plan_general,
    schedule_step,
)
from dsim.engine.compiled_window import _context_ms_packed

# ---- consecutive general steps of one replica, up to its next outside event -------------------


# run_general_steps' replica state, read and written back: one record (RUN_STATE), its fields
# named as RunState's (int64, then float64).
class RunState(NamedTuple):
    """A replica's state as a compiled run of general steps reads and writes it (RUN_STATE)."""

    n: int  # decode slots
    n_pre: int  # prefilling requests
    w_head: int  # the waiting queue's head and tail in Queues.waiting
    w_tail: int
    kv_dec: int  # the decode slots' KV tokens
    pre_blocks: int  # KV blocks the prefilling requests hold
    admit_seq: int  # admissions so far
    left_lb: int  # a lower bound on the decode slots' smallest remaining output
    done_n: int  # finished rows in RunBuffers.done_ints / done_floats
    last_is_prev_end: int  # every decode slot last emitted at prev_end
    n_steps: int  # steps so far, and the sum of their requests
    batch_sum: int
    step_row: int  # the step table's next row, and the end of the rows reserved for the run
    step_row_end: int
    itl_row: int  # the ITL samples' next row, and the end of those reserved
    itl_row_end: int
    next_id: int  # a closed loop's next request (successors SUCC_SELF)
    head_n: int  # the confidence head's samples so far, and this replica's cap (0: no head)
    head_cap: int
    replica: int  # the replica's index (the step rows' replica column)
    successors: int  # SUCC_SELF, SUCC_NONE or SUCC_PYTHON
    pending: int  # a step planned by the previous call (STOP_PLANNED) to commit first: its scalars
    pending_cut: int
    pending_tokens: int
    pending_prefill_tokens: int
    pending_kv: int
    pending_chunked: int
    drafts: int  # the speculative counters Replica._account adds (SpecStats' names), accumulated
    draft_tokens: int
    verified: int
    in_window: int
    full_block: int
    now: float  # the clock (s)
    prev_end: float  # the last step's end (s)
    t_next: float  # the replica's next outside event (s; inf: none)
    pending_forward_ms: float
    pending_duration_ms: float


RUN_STATE = np.dtype([(f, np.float64 if t is float else np.int64) for f, t in get_type_hints(RunState).items()])
RUN_STATE_INTS = sum(t is int for t in get_type_hints(RunState).values())  # (the int fields come first)


class StepCosts(NamedTuple):
    """What a general step's duration is priced from in a compiled run (Replica._plan_step's terms)."""

    below: np.ndarray  # CostModel.forward_args(): the capture table up to its limit,
    ax: np.ndarray  # the profiled sizes above it and their forward (ms),
    ams: np.ndarray
    slope: float  # the last slope past the table,
    limit: int  # the capture limit
    draft_ms: np.ndarray  # float64 [max_num_seqs + 1]: the drafter's cost by requests sampling
    cpu_ms: float  # the CPU overhead of a step (0 with async scheduling)
    terms: bool  # prefill or per-request attention terms (a profile with them)
    context_on: bool  # per-request attention terms
    context: tuple  # ContextArgs


class RunBuffers(NamedTuple):
    """A compiled run's outputs and placeholders (RUN_STATE's rows say where it writes)."""

    steps: np.ndarray  # float64 [fields, rows]: the step table's column-major block
    itl: np.ndarray  # float64 [2, rows]: the ITL samples' block
    head_conf: np.ndarray  # float32: the head's sample (from RunState.head_n)
    head_acc: np.ndarray  # bool
    arrival: np.ndarray  # float64 [requests]: a closed loop's successors' arrival,
    replica_of: np.ndarray  # int64 [requests]: and replica
    no_cut: np.ndarray  # int64 [>= max_num_seqs] of -1: no decode cut by the budget
    no_steps: np.ndarray  # int64 [0, 0]: no draws
    no_conf: np.ndarray  # float32 [0, 0, 0]
    pending_conf: np.ndarray  # the pending step's draws (RunState.pending): confidences,
    pending_lvc: np.ndarray  # lead, verified, cap [3, 1, n],
    pending_given: np.ndarray  # and the budget's cut (no_cut: none)
    moved: np.ndarray  # CommitStep's buffers
    late: np.ndarray
    done_ints: np.ndarray
    done_floats: np.ndarray


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
def run_general_steps(requests, queues, slots, limits, draws, policy, pricing, costs, out, bufs, state):
    """The engine's general steps of one replica (Replica._plan_step, then _commit_step, then the
    loop's next checks), one after another, for as long as each step ends strictly before
    t_next (the next outside event; as Replica._skip) and none needs Python: stops before a
    step where a decode window can run (STOP_WINDOW), the replica is idle (STOP_IDLE), a
    buffer lacks room (STOP_ROOM: the caller makes room and calls again) or the schedule
    preempts (STOP_PYTHON: nothing of that step written, the caller runs it), after planning a
    step that does not end before t_next (STOP_PLANNED: its draws and scalars returned for the
    caller to wait and commit), or after a step that finished requests whose successors the
    simulation submits (STOP_FINISHED). The bundles: requests, queues, slots, limits (a
    RequestTable, Queues, SlotTable, SchedLimits), draws, policy (a DrawParams, PolicyParams),
    pricing (a RowPricing: the budget's cost row and the prefill terms), costs (a StepCosts: the
    step's duration), out (a CommitOut), bufs (a RunBuffers), and state, a RUN_STATE record
    [1] the call reads and writes back. Preconditions
    (the caller's): the fused plan's (an engine cost row, no prefill terms, a token budget
    inside the dense table), no prefix caching, shapes or draft script, slot buffers for
    max_num_seqs slots. A step's records go to bufs.steps (rows state.step_row ..
    step_row_end) and bufs.itl (the ITL samples); the counters to state's drafts .. full_block;
    while the confidence head's sample has fewer than state.head_cap drafts (0: no head), each
    step's first drafts' confidences and outcomes (request by request, as Replica._account takes
    them) to bufs.head_conf / head_acc from state.head_n.
    With costs.terms (a profile with prefill or per-request attention terms) a step's forward
    also carries its prefill chunks' CostModel.prefill_ms (CostModel.prefill_args: pricing's
    pre_mode, pre_coef) and, with costs.context_on, its decodes' per-request attention
    (CostModel.context_ms of their windows, the budget's cut where it cut, from
    CostModel.context_args packed as costs.context), as Replica._plan_step adds them.
    With state.pending the call first commits the step it planned before (STOP_PLANNED's), now
    that the caller has waited until its end (state.now): its draws as bufs' pending_conf,
    pending_lvc, pending_given and its scalars as state's pending_* fields; state.pending is 0
    once it is committed (a STOP_ROOM before that leaves it pending).
    Returns (stop, conf, lvc, given, cut, n_tokens, prefill tokens, KV tokens, forward ms,
    duration ms, prefills with a chunk, finished rows from)."""
    rs = state[0]
    req, q, sl, lim, pol = (
        RequestTable(*requests), Queues(*queues), SlotTable(*slots), SchedLimits(*limits), PolicyParams(*policy)
    )  # fmt: skip
    pr, cs, bf = RowPricing(*pricing), StepCosts(*costs), RunBuffers(*bufs)
    req_i, pre, chunks, waitq = req.ints, q.prefill_ids, q.chunks, q.waiting
    I, F = sl.ints, sl.floats
    S, V, arrival, replica_of = bf.steps, bf.itl, bf.arrival, bf.replica_of
    no_cut, no_steps, no_conf = bf.no_cut, bf.no_steps, bf.no_conf
    draft_tab, cpu_ms = cs.draft_ms, cs.cpu_ms
    K = lim.k
    budget = lim.token_budget
    max_seqs = lim.max_seqs
    adaptive = pol.adaptive
    N_req = arrival.shape[0]
    conf = no_conf
    lvc = np.empty((3, 1, 0), np.int64)
    given = no_cut
    pending = rs.pending != 0
    while True:
        n = rs.n
        n_run0 = rs.n_pre
        w_head, w_tail = rs.w_head, rs.w_tail
        s_i, v_j, d0 = rs.step_row, rs.itl_row, rs.done_n
        if not pending and n == 0 and n_run0 == 0 and w_head == w_tail:
            return STOP_IDLE, conf, lvc, given, False, 0, 0, 0, 0.0, 0.0, 0, d0
        last_prev = rs.last_is_prev_end != 0
        if not pending and n > 0 and n_run0 == 0 and not (w_head < w_tail and n < max_seqs) and n * (1 + K) <= budget:
            ok = last_prev
            if not ok:
                lo = F[0, 0]
                for r in range(1, n):
                    if F[r, 0] < lo:
                        lo = F[r, 0]
                ok = not (lo < rs.prev_end)
            if ok:
                return STOP_WINDOW, conf, lvc, given, False, 0, 0, 0, 0.0, 0.0, 0, d0
        if (s_i >= rs.step_row_end or v_j + max_seqs + 2 > rs.itl_row_end or d0 + max_seqs > bf.done_ints.shape[0]
                or w_tail + max_seqs > waitq.shape[0]):  # fmt: skip
            return STOP_ROOM, conf, lvc, given, False, 0, 0, 0, 0.0, 0.0, 0, d0
        if pending:  # the step planned before the caller's wait: its commit first
            pending = False
            rs.pending = 0
            conf, lvc, given = bf.pending_conf, bf.pending_lvc, bf.pending_given
            cut = rs.pending_cut != 0
            n_tokens, pre_tokens, kv, n_chunked = (
                rs.pending_tokens,
                rs.pending_prefill_tokens,
                rs.pending_kv,
                rs.pending_chunked,
            )
            fwd, dur = rs.pending_forward_ms, rs.pending_duration_ms
            n_pre = rs.n_pre
            kv_dec = rs.kv_dec
            t_end = rs.now  # (the caller waited until the step's end)
            n_run = _decodes_run(n, cut, given)
        else:
            now = rs.now
            kv_dec = rs.kv_dec
            step = (
                n_run0,
                w_head,
                w_tail,
                n,
                kv_dec,
                rs.pre_blocks,
                rs.admit_seq,
                now,
                np.bool_(True),
                no_cut,
                np.int64(-1),
            )
            if K > 0 and n > 0:
                conf = np.empty((1, K, n), np.float32)
                lvc = np.empty((3, 1, n), np.int64)
                sched_st, run_tokens, n_pre, w_head, pre_blocks, admit_seq, pre_tokens, n_sampling, kv_pre, seen, drawn, v0 = (
                    plan_general(
                        requests, queues, slots, limits, step, draws, policy, pricing, cpu_ms + draft_tab[n],
                        (conf, lvc[0], lvc[1], lvc[2]),
                    )
                )  # fmt: skip
            else:
                conf = no_conf
                lvc = np.empty((3, 1, 0), np.int64)
                v0 = 0
                sched_st, run_tokens, n_pre, w_head, pre_blocks, admit_seq, pre_tokens, n_sampling, kv_pre, seen = (
                    schedule_step(requests, queues, slots, limits, step)
                )  # fmt: skip
            if sched_st == PREEMPT:  # (nothing written: the caller preempts and schedules)
                return STOP_PYTHON, conf, lvc, given, False, 0, 0, 0, 0.0, 0.0, 0, d0
            rs.n_pre, rs.w_head, rs.pre_blocks, rs.admit_seq = n_pre, w_head, pre_blocks, admit_seq
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
                        qr = 1 + lvc[1, 0, r] if K > 0 else 1
                        g = budget - before
                        if g < 0:
                            g = 0
                        given[r] = qr if qr < g else g
                        before += qr
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
            fwd = _forward_ms(n_tokens, cs.below, cs.ax, cs.ams, cs.slope, cs.limit) + pr.kv_ms_per_tok * kv
            if cs.terms:  # (Replica._plan_step's order: forward, then prefill, then attention terms)
                pre_ms = prefill_ms_compiled(pr.pre_mode, pr.pre_coef, chunks, req_i[COMPUTED], pre, n_pre)
                ctx_ms = 0.0
                if cs.context_on and n > 0:
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
                        ctx_ms = _context_ms_packed(ctx_q[:m_q], ctx_c[:m_q], cs.context)
                fwd = fwd + pre_ms + ctx_ms
            dur = fwd + (draft_tab[n_sample] if K > 0 and n_sample > 0 else 0.0) + cpu_ms
            t_end = now + dur / 1000.0
            if not rs.t_next > t_end:  # an outside event first: the caller waits, then commits
                return STOP_PLANNED, conf, lvc, given, cut, n_tokens, pre_tokens, kv, fwd, dur, n_chunked, d0
        # ---- the commit (as Replica._commit_step) ----
        rs.now = t_end
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
                rs.last_is_prev_end = 0 if cut else 1
        if K > 0 and n > 0:
            plan = (conf, lvc[0], lvc[1], lvc[2])
        else:
            plan = (no_conf, no_steps, no_steps, no_steps)
        commit = (
            n_pre, itl_mode, itl_ms, t_end, rs.prev_end, V, jpos, rs.left_lb, bf.moved, bf.late, bf.done_ints,
            bf.done_floats, d0,
        )  # fmt: skip
        vt, at, lt, et, w, d, ml, done_kv, m, freed, kv_new, w_pre, n_late = commit_step(
            slots, n, K, plan, given, out, policy, requests, queues, commit
        )
        rs.n_pre = w_pre
        if n_pre > 0:
            rs.pre_blocks -= freed
            kv_dec += kv_new
            for k in range(n_late):
                V[0, v_j] = bf.late[k]
                V[1, v_j] = 1.0
                v_j += 1
        if n > 0:
            if K > 0:
                rs.drafts += n
                rs.draft_tokens += n * K
                rs.verified += vt
                if adaptive:
                    rs.in_window += at
                    rs.full_block += lt
                h = rs.head_n
                cap_h = rs.head_cap
                if h < cap_h:
                    qh = (cap_h - h + K - 1) // K
                    if qh > n:
                        qh = n
                    for r in range(qh):
                        for j in range(K):
                            bf.head_conf[h] = conf[0, j, r]
                            bf.head_acc[h] = j < lvc[0, 0, r]
                            h += 1
                    rs.head_n = h
            kv_dec += et
        rs.left_lb = ml
        rs.kv_dec = kv_dec - done_kv
        rs.n = w
        rs.done_n = d0 + d
        rs.prev_end = t_end
        n_req = n_run + n_chunked
        rs.n_steps += 1
        rs.batch_sum += n_req
        S[SC_REPLICA, s_i] = rs.replica
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
        S[SC_WAITING, s_i] = rs.w_tail - rs.w_head
        rs.step_row = s_i + 1
        rs.itl_row = v_j
        if d > 0:
            if rs.successors == SUCC_PYTHON:
                return STOP_FINISHED, conf, lvc, given, False, 0, 0, 0, 0.0, 0.0, 0, d0
            if rs.successors == SUCC_SELF:  # the finished users' next requests, arriving now
                i0 = rs.next_id
                i1 = i0 + d if i0 + d < N_req else N_req
                tail = rs.w_tail
                for rid in range(i0, i1):
                    arrival[rid] = t_end
                    replica_of[rid] = rs.replica
                    waitq[tail] = rid
                    tail += 1
                rs.w_tail = tail
                if i1 > i0:
                    rs.next_id = i1
