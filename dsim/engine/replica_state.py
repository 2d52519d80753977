"""A replica's state: its decode-slot, prefill and waiting-queue buffers, the compiled kernels'
bundles built from its configuration, cost model and method, and the buffers' growth
(ReplicaState, the base of dsim.engine.replica.Replica)."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import simpy

from dsim.cost import KV_BLOCK_TOKENS, CostModel
from dsim.engine import compiled_bundles, compiled_general_steps, compiled_sched, compiled_window
from dsim.engine.buffers import Columns, WaitQueue, grown
from dsim.engine.compiled_bundles import NCOL
from dsim.engine.config import EngineConfig, draft_script_table
from dsim.engine.records import STEP_FIELDS
from dsim.engine.shared import DraftCost, Requests, SpecStats
from dsim.spec.runtime import SpecRuntime

LAST, ITLMAX = range(2)  # float64 columns of ReplicaState._slot_floats


class ReplicaState:
    """A replica's state (Replica, dsim.engine.replica, is the whole): decode slots are buffers with
    room for ``capacity`` slots, the first ``n`` live: the int table ``_slot_ints`` [capacity,
    NCOL] (columns in dsim.engine.compiled_bundles), the float table ``_slot_floats`` (last emission,
    largest ITL: columns LAST, ITLMAX) and the float32 rows ``_slot_rows`` [rows, capacity]
    (position-major: the acceptance model's slot offsets, then the confidences of the previous
    draft round from row ``_hist_row`` and, where the budget policy reads them, of the one before
    from ``_hist2_row``), together the kernels' ``SlotTable``. The compiled kernels work on these
    buffers in place; so do the scheduler's (dsim.engine.compiled_sched) on the request table, the
    prefilling requests' buffer (pre_ids[:n_pre], queue order) and the waiting queue's. The
    kernels take them as the named bundles of dsim.engine.compiled_bundles, compiled_sched and
    compiled_general_steps: those fixed for the run built once here (``_draws``, ``_policy``,
    ``_limits``, ``_pricing``, ``_context_args``; the compiled runs' ``_step_costs``), those of
    buffers that grow built again when a buffer grows (``_slots``, ``_commit_out``, ``_queues()``).
    ``K`` is the method's drafts per step (0 without speculation), ``requests`` the simulation's
    shared request table.
    """

    # A speculative general step's schedule, cost row and draws in one compiled call where it can
    # (dsim.engine.compiled_sched.plan_general); False: schedule_step and plan_decodes called apart (the
    # same results: tests/test_engine.py).
    fuse_plan = True

    def __init__(
        self,
        idx: int,
        env: simpy.Environment,
        reqs: Requests,
        cost: CostModel,
        cfg: EngineConfig,
        spec: SpecRuntime | None,
        stats: SpecStats,
        on_finish,
        draw_key: int = 0,
        prefix_hashes=None,
        prefix_block_tokens: int = 512,
        keep_steps: bool = True,
        draft_cost: DraftCost | None = None,
    ):
        self.idx = idx
        self.env = env
        self.requests = reqs
        self.cost = cost
        self.cfg = cfg
        self.spec = spec
        K = self.K = spec.k if spec is not None else 0
        self.key = int(draw_key)  # the draws' run key (dsim.engine.compiled_draws)
        self.stats = stats
        self.on_finish = on_finish
        pol = spec.policy if K else None
        self._adaptive = pol is not None
        self._has_head = bool(K) and spec.method.has_head
        acc = spec.acceptance if K else None
        off = acc.slot_offsets(reqs.cls, reqs.latent) if K else np.zeros((0, reqs.n), np.float32)
        self._off_rows = len(off)
        track = self._adaptive and (pol.reads_prev or pol.reads_prev2)
        track2 = self._adaptive and pol.reads_prev2
        self._hist_row = self._off_rows if track else -1
        self._hist2_row = self._off_rows + K if track2 else -1
        rows = self._off_rows + K * (track + track2)
        if K and (reqs.slot_rows is None or reqs.slot_rows.shape[1] != rows):
            # request-major [requests, rows]: a request's rows are one contiguous read
            sr = np.ones((reqs.n, rows), dtype=np.float32)
            sr[:, : len(off)] = off.T
            reqs.slot_rows = sr
        # The bundles the compiled kernels take (dsim.engine.compiled_bundles, dsim.engine.compiled_sched), built once
        # where they are fixed for the run; every bundle travels as a plain tuple (see
        # dsim.engine.compiled_bundles' "named bundles").
        head, *draw_f = acc.kernel_params() if K else (compiled_bundles.HEAD_MODEL, 0.0, 0.0, 0.0, 0.0, 0.0)
        self._draws = tuple(compiled_bundles.DrawParams(self.key, int(head), *(float(x) for x in draw_f)))
        # A general step's schedule and draws in one compiled call (dsim.engine.compiled_sched.plan_general)
        # where the budget's cost row is the engine's dense one and no prefill term prices it.
        # prefill_ms's terms for the kernels (None: priced in Python only)
        self._prefill_args = cost.prefill_args()
        self._plan_fused = (
            self.fuse_plan and bool(K) and self._prefill_args is not None and not (pol is not None and pol.own_cost_row)
        )
        self._row_buf = np.empty(cfg.max_num_batched_tokens + 1) if self._plan_fused else None
        self._policy_code = pol.code if pol is not None else -1
        self._policy_tau = float(pol.tau) if pol is not None else 0.0
        self._verify_mode = compiled_bundles.VERIFY_CODES[spec.verify_mode] if K else compiled_bundles.COMPACT
        # A window's later steps read more KV: their budgets' cost rises by this per token of
        # context emitted before them (0 for a policy whose cost table fixes the context).
        self._context_ms_per_tok = cost.kv_ms_per_tok if pol is not None and pol.prices_context else 0.0
        self._policy = tuple(
            compiled_bundles.PolicyParams(
                self._adaptive, int(self._policy_code), self._policy_tau, int(self._hist_row), int(self._hist2_row), int(self._verify_mode),
                float(self._context_ms_per_tok),
            )
        )  # fmt: skip
        self._no_row = np.zeros(1)
        self._no_rows = np.zeros((1, 1), dtype=np.float32)  # (new_slots' slot rows without drafts)
        self._no_conf = np.zeros((0, 0, 0), dtype=np.float32)  # (the commit's confidences without drafts)
        self._no_steps = np.zeros((0, 0), dtype=np.int64)
        # decode_given of an uncut step, and the commit and removal kernels' outputs, reused from
        # step to step: per slot (these two) grown with the slot buffers (_grow_slots); per step,
        # sized to the longest commit so far
        self._no_cut = np.full(16, -1, dtype=np.int64)
        self._slot_out = np.empty((3, 16), dtype=np.int64)
        self._step_out = np.empty((3, 1), dtype=np.int64)
        # The finished requests' slot rows and (last emission, largest ITL, finish time), written
        # in place by the removal kernel and read by flush.
        self._done_ints = np.empty((64, NCOL), dtype=np.int64)
        self._done_floats = np.empty((64, 3), dtype=np.float64)
        self._done_n = 0
        self._forward_table = cost.forward_table()
        self._context_args = tuple(
            compiled_bundles.ContextArgs(*compiled_window.pack_context_args(cost.context_args()))
        )
        self._context_packed = cost.request_attention is not None  # (see _context_ms)
        # A decode window's per-step shape (dsim.engine.compiled_window.window_steps' rows), reused.
        self._window_ints = np.empty((3, max(1, cfg.max_window)), dtype=np.int64)
        self._window_floats = np.empty((5, max(1, cfg.max_window)), dtype=np.float64)
        self._script = (
            draft_script_table(cfg.draft_script, K, self._adaptive) if K and cfg.draft_script is not None else None
        )
        cap = 16
        self.n = 0  # live decode slots
        self._slot_ints = np.zeros((cap, NCOL), dtype=np.int64)
        self._slot_floats = np.zeros((cap, 2), dtype=np.float64)
        self._slot_rows = np.zeros((rows, cap), dtype=np.float32)
        self._bundle_buffers()
        self._request_table = (reqs.req_i, reqs.req_f, reqs.slot_rows if K else self._no_rows)  # (a RequestTable)
        # The requests still prefilling, in queue order (pre_ids[:n_pre]), and this step's chunks
        # of them (chunks[:n_pre]); at most max_num_seqs run. The new decode slots' rows and the
        # resumed requests' ITL gaps of a commit (dsim.engine.compiled_sched.commit_prefills).
        seqs = max(1, cfg.max_num_seqs)
        self.pre_ids = np.zeros(seqs, dtype=np.int64)
        self.chunks = np.zeros(seqs, dtype=np.int64)
        self.n_pre = 0
        self._moved = np.zeros(6 * seqs, dtype=np.int64)
        self._late = np.zeros(seqs)
        self._no_hits = np.zeros(0, dtype=np.int64)
        self._prefix_on = cfg.enable_prefix_caching and prefix_hashes is not None
        self.admit_seq = 0
        self.waiting = WaitQueue()
        self.in_transit = 0  # disaggregated: requests still on the prefill instance or in transfer
        self._kv_consumer = cfg.disaggregated
        self.kv_dec = 0  # sum of the decode slots' KV tokens
        # The smallest output any decode slot still has to emit (exact after each commit, a
        # lower bound after admissions): no completion check is needed while it stays positive.
        self.left_lb = 0
        # KV blocks. A decode slot holds ceil((KV tokens + lookahead) / 16) blocks, lookahead = 1 + K
        # (vLLM allocates slots for the drafts), a function of its KV tokens: the total is
        # checked against a cheap upper bound from kv_dec and computed exactly only near a full cache.
        self.total_blocks = cost.profile.kv_capacity_blocks
        self.pre_blocks = 0  # blocks held by requests still prefilling
        self.lookahead = 1 + K
        # submit's check: ceil((prompt + output - 1 + lookahead) / 16) > total_blocks exactly
        # when prompt + output > this
        self._fit_tokens = KV_BLOCK_TOKENS * self.total_blocks + 1 - self.lookahead
        self._limits = tuple(
            compiled_sched.SchedLimits(
                K, self.lookahead, int(self.total_blocks), cfg.max_num_batched_tokens, cfg.long_prefill_token_threshold,
                cfg.max_num_seqs, bool(self._kv_consumer),
            )
        )  # fmt: skip
        self._pricing = (
            tuple(
                compiled_sched.RowPricing(
                    self._forward_table, float(cost.kv_ms_per_tok), self._prefill_args[0], self._prefill_args[1],
                    self._row_buf if self._row_buf is not None else np.zeros(1),
                )
            )
            if self._prefill_args is not None
            else None
        )  # fmt: skip
        self._transit_delay = self._kv_consumer and (cfg.remote_prefill_ms > 0 or cfg.remote_prefill_ms_per_ktok > 0)
        self.cpu_ms = 0.0 if cfg.async_scheduling else cost.cpu_overhead_ms
        self._step_terms = cost.has_prefill_terms or cost.has_context_terms
        self.prev_end = -1.0
        self._last_is_prev_end = True  # every decode slot last emitted at prev_end (see commit_step's itl_mode)
        self.steps = Columns(len(STEP_FIELDS), keep=keep_steps)  # the step table's rows (STEP_FIELDS order)
        # the step count and the sum of the steps' n_requests (whole numbers), kept or not
        self.n_steps = 0
        self.batch_sum = 0
        self.head_conf: list = []  # the head's sample from this replica (SpecStats.replica_cap)
        self.head_acc: list = []
        self.head_n = 0
        self.itl_vals = Columns(2)  # (gap_ms, count) rows: ITL samples, run-length coded
        self.wake = env.event()
        self.prefix_hashes = prefix_hashes
        self.prefix_block_tokens = prefix_block_tokens
        self.prefix_cache: OrderedDict = OrderedDict()
        self.prefix_cap = max(1, self.total_blocks * KV_BLOCK_TOKENS // prefix_block_tokens)
        for h in cfg.prefix_cache_warm[-self.prefix_cap :]:
            self.prefix_cache[int(h)] = True
        # the drafter's cost by batch size (shared by the simulation's replicas)
        self.draft_cost = draft_cost if draft_cost is not None or spec is None else DraftCost(spec.method, cost)
        self.shapes: list | None = [] if cfg.record_shapes else None  # for --step-log
        self.next_arrival = lambda: None  # set by the simulation: time of the next open-loop arrival
        # Who submits the successors of the requests this replica finishes (set by the
        # simulation): SUCC_SELF, a closed loop whose users all send to this replica at once
        # (closed_next: the next request id, one element); SUCC_NONE, nobody (an open loop);
        # SUCC_PYTHON, the simulation's on_finish.
        self.successors = compiled_general_steps.SUCC_PYTHON
        self.closed_next = np.zeros(1, dtype=np.int64)

    # ---- decode-slot buffers ----------------------------------------------------------------
    @property
    def live_ints(self) -> np.ndarray:
        """The live decode slots' int rows (columns ID .. VSUM of dsim.engine.compiled_bundles)."""
        return self._slot_ints[: self.n]

    @property
    def live_floats(self) -> np.ndarray:
        """The live decode slots' last emission (s) and largest ITL (ms)."""
        return self._slot_floats[: self.n]

    # The bundles of buffers that grow, as plain tuples (see __init__), rebuilt when one grows.
    def _bundle_buffers(self) -> None:
        """self._slots (dsim.engine.compiled_bundles.SlotTable) and self._commit_out (CommitOut) of the
        current buffers."""
        self._slots = (self._slot_ints, self._slot_floats, self._slot_rows)
        self._commit_out = (self.stats.accepted_hist, self._slot_out, self._step_out)

    def _queues(self) -> tuple:
        """The prefilling requests and the waiting queue's buffer (dsim.engine.compiled_sched.Queues; the
        buffer moves as the queue grows)."""
        return (self.pre_ids, self.chunks, self.waiting.buf)

    def _grow_slots(self, cap: int) -> None:
        """Room for cap decode slots in the slot buffers (doubling). Precondition: cap > their
        capacity, len(self._slot_ints) (the caller checks: a general step's commit)."""
        n = self.n
        cap = max(2 * len(self._slot_ints), cap)
        self._slot_ints, self._slot_floats = (grown(a, cap, n, np.zeros) for a in (self._slot_ints, self._slot_floats))
        x = np.zeros((len(self._slot_rows), cap), dtype=np.float32)
        x[:, :n] = self._slot_rows[:, :n]
        self._slot_rows = x
        self._no_cut = np.full(cap, -1, dtype=np.int64)
        self._slot_out = np.empty((3, cap), dtype=np.int64)
        self._bundle_buffers()

    def _grow_done(self, rows: int) -> None:
        """Room for rows finished requests' rows (doubling)."""
        if rows <= len(self._done_ints):
            return
        d0 = self._done_n
        cap = max(2 * len(self._done_ints), rows)
        self._done_ints, self._done_floats = (grown(a, cap, d0, np.empty) for a in (self._done_ints, self._done_floats))

    def _remove_slot(self, j: int):
        n = self.n
        self._slot_ints[j : n - 1] = self._slot_ints[j + 1 : n]
        self._slot_floats[j : n - 1] = self._slot_floats[j + 1 : n]
        if self.K:
            self._slot_rows[:, j : n - 1] = self._slot_rows[:, j + 1 : n]
        self.n = n - 1

    # ---- helpers ----------------------------------------------------------------------------
    def _draft_ms(self, n: int) -> float:
        if self.K == 0 or n == 0:
            return 0.0
        return self.draft_cost.ms(n)

    def _skip(self, delay_s: float) -> bool:
        """Advance the clock by delay_s without an event where nothing else is scheduled up to
        then (the next event strictly later), as waiting on a timeout would: nothing else can
        run in between, and the clock reads what the timeout would set (now + delay). An event
        at the same instant is left to simpy's order (then False: the caller waits)."""
        env = self.env
        t = env._now + delay_s
        q = env._queue  # (simpy.Environment's event heap and clock: peek() and a timeout's value)
        if not q or q[0][0] > t:
            env._now = t
            return True
        return False
