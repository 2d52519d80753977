"""A replica's compiled runs: consecutive general steps as one compiled call
(dsim.engine.compiled_general_steps.run_general_steps) while each ends before the replica's next outside
event and none needs Python; the replica's state goes in and comes back through one record."""

from __future__ import annotations

import math

import numpy as np

from dsim.engine import compiled_general_steps, compiled_sched
from dsim.engine.background_compile import Deferred
from dsim.engine.compiled_bundles import ID
from dsim.engine.general_step import GeneralSteps
from dsim.engine.records import StepPlan

# The compiled runs' state record (dsim.engine.compiled_general_steps.RunState) as _run_steps_compiled writes and
# reads its int fields, in one operation each.
_RUN_INT_FIELDS = (
    "n", "n_pre", "w_head", "w_tail", "kv_dec", "pre_blocks", "admit_seq", "left_lb", "done_n", "last_is_prev_end",
    "n_steps", "batch_sum", "step_row", "step_row_end", "itl_row", "itl_row_end", "next_id", "head_n", "head_cap",
    "replica", "successors", "pending", "pending_cut", "pending_tokens", "pending_prefill_tokens", "pending_kv",
    "pending_chunked", "drafts", "draft_tokens", "verified", "in_window", "full_block",
)  # fmt: skip
_RUN_FLOAT_FIELDS = ("now", "prev_end", "t_next", "pending_forward_ms", "pending_duration_ms")
if (
    compiled_general_steps.RunState._fields != _RUN_INT_FIELDS + _RUN_FLOAT_FIELDS
    or compiled_general_steps.RUN_STATE_INTS != len(_RUN_INT_FIELDS)
):
    raise ImportError(f"RunState's fields are not the engine's {_RUN_INT_FIELDS + _RUN_FLOAT_FIELDS}")

# The compiled run of general steps, compiled in a background process where numba's cache lacks
# it (dsim.engine.background_compile): its steps run from Python meanwhile, with the same results. Its
# Python path compiles schedule_step (alone or inside plan_general) and commit_step itself.
RUN_STEPS_KERNEL = Deferred(
    compiled_general_steps.run_general_steps, lambda: (compiled_sched.schedule_step, compiled_sched.commit_step)
)


class CompiledRuns(GeneralSteps):
    """A replica's compiled runs of general steps (see dsim.engine.replica for the step paths)."""

    # Consecutive general steps as one compiled call where they can (dsim.engine.compiled_sched.
    # run_general_steps); False: each step planned and committed from Python (the same results:
    # tests/test_engine.py).
    run_compiled = True
    _RUN_STEPS = 256  # step rows a compiled run reserves (it stops when they are used up)

    def _setup_steps_compiled(self) -> None:
        """Whether consecutive general steps can run as one compiled call (the preconditions of
        dsim.engine.compiled_general_steps.run_general_steps that hold for the whole run), and its static
        arguments."""
        cfg, K, cost = self.cfg, self.K, self.cost
        self._steps_compiled = (
            self.run_compiled
            and (K == 0 or self._plan_fused)
            and not self._prefix_on
            and self.shapes is None
            and self._script is None
            and self._prefill_args is not None
            and (not cost.has_context_terms or (self._context_packed and not cost.context_reads_chunks))
            and not self._transit_delay
            and self.requests.longest_life <= self._fit_tokens
            and (not self._adaptive or cfg.max_num_batched_tokens + 1 <= len(self._forward_table))
        )
        # a step the compiled run planned and handed back to wait on (STOP_PLANNED): its draws and
        # scalars, committed by the next run (which then goes on) once its end has come
        self._run_planned: tuple | None = None
        self._run_pending: tuple | None = None
        self._step_s = 0.0  # the last step's duration (s), for _run_pays
        if not self._steps_compiled:
            return
        below, ax, ams, slope, limit = cost.forward_args()
        self._step_costs: tuple | None = None  # (a StepCosts, once the drafter's table is built)
        self._step_costs_parts = (below, ax, ams, float(slope), int(limit))
        self._run_state = np.zeros(1, dtype=compiled_general_steps.RUN_STATE)
        # its int64 and float64 fields as two arrays, each written and read in one operation
        # (_RUN_INT_FIELDS' order, checked against RunState's on import)
        self._run_ints = self._run_state.view(np.int64)[: compiled_general_steps.RUN_STATE_INTS]
        self._run_floats = self._run_state.view(np.float64)[compiled_general_steps.RUN_STATE_INTS :]
        self._no_lvc = np.zeros((3, 1, 0), dtype=np.int64)
        self._draft_tab: np.ndarray | None = None
        # the head's sample, as the compiled steps take it (its slices join head_conf / head_acc)
        hb = self.stats.replica_cap + K if self._has_head else 0
        self._head_conf_buf = np.empty(hb, dtype=np.float32)
        self._head_acc_buf = np.empty(hb, dtype=np.bool_)

    def _run_pays(self) -> bool:
        """Whether a compiled run of steps is likely to run more than one step: the replica's
        next outside event (the head of simpy's queue) is more than two of its last steps
        away. Replicas stepping in turn (several in one simulation) mostly plan one step a call,
        where the call's set-up (its bundles' 60-odd arrays and numbers to type, the state
        record in and out) costs more than the Python step it replaces; the results are the
        same either way."""
        q = self.env._queue
        return not q or q[0][0] - self.env._now > 2.0 * self._step_s

    def _run_steps_compiled(self) -> tuple:
        """General steps from now as one compiled call (dsim.engine.compiled_general_steps.run_general_steps):
        the replica's state in, its steps' records and counters written, its state back. Returns
        (why it stopped, the StepPlan of a planned step not yet committed or None)."""
        env, R, K, cfg = self.env, self.requests, self.K, self.cfg
        seqs = cfg.max_num_seqs
        if self._draft_tab is None:  # the drafter's cost at every batch size a step can have
            self._draft_tab = self.draft_cost.upto(seqs) if self.K else np.zeros(seqs + 1)
            cost = self.cost
            self._step_costs = tuple(
                compiled_general_steps.StepCosts(
                    *self._step_costs_parts, self._draft_tab, float(self.cpu_ms), bool(self._step_terms),
                    bool(cost.has_context_terms), self._context_args,
                )
            )  # fmt: skip
        if len(self._slot_ints) < seqs:
            self._grow_slots(seqs)
        if self._done_n + seqs > len(self._done_ints):
            self._grow_done(self._done_n + seqs)
        wq = self.waiting
        wq.make_room(0, seqs)  # (the successors the run may submit)
        steps, itl = self.steps, self.itl_vals
        v_cap = 4 * (seqs + 2)
        i0 = steps.reserve(self._RUN_STEPS)
        j0 = itl.reserve(v_cap)
        p_conf, p_lvc, p_given = self._no_conf, self._no_lvc, self._no_cut
        pp = None
        if self._run_pending is not None:  # (the planned step's draws and scalars, from its StepPlan)
            pp, p_conf, p_lvc = self._run_pending
            if pp.decode_given is not None:
                p_given = pp.decode_given
        q = env._queue  # (simpy's event heap, as _skip reads it)
        t_next = float(q[0][0]) if q else math.inf
        self._run_ints[:] = (
            self.n, self.n_pre, wq.head, wq.tail, self.kv_dec, self.pre_blocks, self.admit_seq, self.left_lb,
            self._done_n, self._last_is_prev_end, self.n_steps, self.batch_sum, i0, i0 + self._RUN_STEPS, j0,
            j0 + v_cap, self.closed_next[0], self.head_n, self.stats.replica_cap if self._has_head else 0, self.idx,
            self.successors, pp is not None, pp is not None and pp.decode_given is not None,
            pp.n_tokens if pp else 0, pp.prefill_tokens if pp else 0, pp.kv_tokens if pp else 0,
            pp.n_prefill if pp else 0, 0, 0, 0, 0, 0,
        )  # fmt: skip
        self._run_floats[:] = (
            env._now, self.prev_end, t_next, pp.forward_ms if pp else 0.0, pp.duration_ms if pp else 0.0
        )  # fmt: skip
        bufs = (
            steps.a, itl.a, self._head_conf_buf, self._head_acc_buf, R.arrival, R.replica, self._no_cut,
            self._no_steps, self._no_conf, p_conf, p_lvc, p_given, self._moved, self._late, self._done_ints,
            self._done_floats,
        )  # (a RunBuffers)  # fmt: skip
        args = (
            self._request_table, self._queues(), self._slots, self._limits, self._draws, self._policy, self._pricing,
            self._step_costs, self._commit_out, bufs, self._run_state,
        )  # fmt: skip
        if not RUN_STEPS_KERNEL.ready(args):  # (compiling in the background: this step from Python)
            steps.release(i0)
            itl.release(j0)
            return compiled_general_steps.STOP_PYTHON, None
        stop, conf, lvc, given, cut, n_tokens, pre_tokens, kv, fwd, dur, n_chunked, d0 = (
            compiled_general_steps.run_general_steps(*args)
        )
        n_dec, h0 = self.n, self.head_n
        (self.n, self.n_pre, wq.head, wq.tail, self.kv_dec, self.pre_blocks, self.admit_seq, self.left_lb,
         self._done_n, last_prev, self.n_steps, self.batch_sum, s_row, _, v_row, _, self.closed_next[0], self.head_n,
         _, _, _, still_pending, _, _, _, _, _, drafts, draft_tokens, verified, in_window,
         full_block) = self._run_ints.tolist()  # fmt: skip
        if not still_pending:
            self._run_pending = None
        if self.head_n > h0:
            self.head_conf.append(self._head_conf_buf[h0 : self.head_n])
            self.head_acc.append(self._head_acc_buf[h0 : self.head_n])
        self._last_is_prev_end = bool(last_prev)
        steps.release(s_row)
        itl.release(v_row)
        env._now, self.prev_end = self._run_floats[:2].tolist()
        if drafts or draft_tokens or verified or in_window or full_block:
            sp = self.stats
            sp.num_drafts += drafts
            sp.num_draft_tokens += draft_tokens
            sp.verified_draft_tokens += verified
            sp.accepted_in_window += in_window
            sp.accepted_full_block += full_block
        if stop == compiled_general_steps.STOP_FINISHED:
            self.on_finish(self._done_ints[d0 : self._done_n, ID].tolist())
        if stop != compiled_general_steps.STOP_PLANNED:
            return stop, None
        n_pre = self.n_pre
        drafts = K and n_dec
        plan = StepPlan(
            n_dec, given if cut else None, conf if drafts else None, lvc[0] if drafts else None,
            lvc[1] if drafts else None, lvc[2] if drafts else None, self.pre_ids[:n_pre], self.chunks[:n_pre],
            n_chunked, n_tokens, pre_tokens, kv, fwd, dur,
        )  # fmt: skip
        self._run_planned = (plan, conf, lvc)
        return stop, plan
