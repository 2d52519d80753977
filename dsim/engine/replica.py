"""One engine replica: a continuous-batching scheduler with vLLM V1 semantics (docs/user/semantics.md §7).

Each step:
1. running requests first: a decode reserves 1 + K tokens and verifies 1 + its window, a prefill
   takes what is left of the token budget (chunked prefill), capped by long_prefill_token_threshold;
2. KV blocks (16 tokens) are allocated for the scheduled tokens; when they run out the engine
   preempts the most recently admitted request (recompute later) and admits nobody this step;
3. waiting requests are admitted FCFS while the budget, the sequence cap and the KV cache allow;
   prefix-cache hits (full blocks already cached) reduce the tokens to compute;
4. the step's wall time = cost model (forward of n tokens reading kv tokens) + drafter + CPU
   scheduling overhead (hidden when async scheduling overlaps it with the GPU step);
5. prefills that finish their prompt sample one token; decodes emit accepted + 1 tokens.

State is arrays over requests (global per-request table) and the running batch; nothing is a
Python object per request or per token. The step's numeric work runs in compiled kernels: the
scheduler's prefill chunks, KV growth and admission (dsim.engine.compiled_sched.schedule_step), the
draws, verify windows and verify modes (dsim.engine.compiled_step.plan_decodes) and the commit
(dsim.engine.compiled_sched.commit_step: prefills, decodes, new decode slots, removal of finished
ones). A step is planned as a ``StepPlan`` and committed as a ``DecodeOutcome``
(``_commit_step``); a decode window commits in the compiled ``commit_window`` (the same
``commit_decodes``, then the window's rows) and returns its ``DecodeOutcome``, and both end in
one accounting path (``_account``).

Decode-only stretches (nothing to admit, no prefill running) are simulated as a *window* of up to
``max_window`` steps (and ``WINDOW_SLOTS`` slots x steps) at once ([k, R] arrays), then committed up to the first event (a completion,
a KV shortage, a wake-up by an arrival); later steps are dropped. This is exact: a request's draws
come from its own stream per draft round, so every committed step is what a one-by-one loop
produces (tested for every method and policy).

The step paths (``Replica.loop`` picks one per step; all give the same results, byte for byte):

* general step from Python (``_plan_step``, ``_commit_step``): always available, and the only
  path for prefix caching, step shapes, a draft script, a remote prefill delay and a preemption.
  A speculative step's schedule and draws are one compiled call (``plan_general``) where the
  budget is priced on the engine's own cost row and the profile's prefill terms compile;
  otherwise (a policy with its own cost table, or prefill terms only Python prices)
  ``schedule_step`` and ``plan_decodes`` are called apart, the row priced in Python between them.
* decode window (``_decode_window``): a decode-only batch with nothing to admit, up to the first
  possible completion; its draws and shape in one call (``plan_window``), or, with a draft
  script or step shapes (which Python applies between the draws and the shape), ``plan_decodes``
  and ``window_steps`` apart; one commit (``commit_window``).
* compiled run of general steps (``_run_steps_compiled``, ``run_general_steps``): consecutive
  general steps in one call while each ends before the replica's next outside event and none
  needs Python (the preconditions in ``_setup_steps_compiled``). It pays where one replica runs
  many general steps alone (a closed loop on one replica; docs/results/performance.md "Engine speed"),
  not where replicas step in turn, each call then planning about one step (``_run_pays`` keeps
  those on the Python path). Where numba's cache lacks it, a background
  process compiles it (``dsim.background_compile``) and the Python path runs meanwhile.

``Replica.fuse_plan = False`` and ``Replica.run_compiled = False`` force the paths apart and the
Python path (the tests compare them). Each path is needed by some configuration, so none is
kept only for speed.

The compiled kernels take named bundles (``dsim.engine.compiled_step.SlotTable``, ``DrawParams``,
``PolicyParams``, ``DecodePlan``, ``CommitOut``, ``WindowPricing``; ``dsim.engine.compiled_sched.RequestTable``,
``Queues``, ``SchedLimits``, ``SchedStep``, ``CommitStep``, ``RowPricing``, ``StepCosts``,
``RunBuffers`` and the ``RUN_STATE`` record), passed as plain tuples (see dsim.engine.compiled_step).
"""

from __future__ import annotations

import math
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import simpy

from dsim.cost import KV_BLOCK_TOKENS, CostModel
from dsim.engine import compiled_sched as KSched
from dsim.engine import compiled_step as KS
from dsim.engine.background_compile import Deferred
from dsim.engine.compiled_step import ASUM, CLS, COMP, EMITS, END, ID, NCOL, ROUNDS, VSUM
from dsim.errors import InputError
from dsim.spec.methods import SpecRuntime

if TYPE_CHECKING:
    from collections.abc import Generator


@dataclass(frozen=True)
class EngineConfig:
    max_num_seqs: int = 1024  # vLLM default on H100/H200-class GPUs
    max_num_batched_tokens: int = 8192  # vLLM default on H100/H200-class GPUs
    long_prefill_token_threshold: int = 0  # 0: off
    enable_prefix_caching: bool = False
    # block hashes already in the prefix cache when the run starts (a server that served these
    # prompts before: the validator's replays of a measured run)
    prefix_cache_warm: tuple = ()
    async_scheduling: bool = False  # overlap CPU scheduling with the GPU step
    max_window: int = 256  # decode steps simulated at once, at most (see WINDOW_SLOTS)
    record_shapes: bool = False  # keep each step's (query tokens, context) per request
    # Prefill/decode disaggregation, in vLLM's words (kv_transfer_config.kv_role; DeepSeek-V3
    # report Sec. 3.4). None: prefill runs on these GPUs. "kv_consumer": a decode instance; a
    # request arrives with its prompt's KV computed elsewhere and transferred, so its first step
    # computes only the last prompt token (as vLLM's scheduler does on a full external KV hit, to
    # sample the first output token) while attention reads, and KV blocks hold, the whole prompt.
    # Before it reaches the decode instance a request spends remote_prefill_ms + its prompt's
    # thousands of tokens x remote_prefill_ms_per_ktok on the prefill instance and the transfer
    # (an assumption, 0 by default; no queueing there: the prefill fleet is taken as sized for the
    # load). TTFT stays first token - arrival at the service, so it includes that delay.
    kv_role: str | None = None
    remote_prefill_ms: float = 0.0
    remote_prefill_ms_per_ktok: float = 0.0
    # Deterministic drafting (apply_draft_script): decode step j of every request verifies
    # draft_script[j][0] drafts and accepts draft_script[j][1] of them, the last entry repeating,
    # in place of the acceptance draws. What an n-gram proposer does on identical greedy requests
    # (vLLM drafts only where the n-gram matches: steps without a match verify nothing); the
    # validator measures the script from a real server's chunk streams. None: drawn acceptance.
    draft_script: tuple | None = None

    @property
    def disaggregated(self) -> bool:
        return self.kv_role == "kv_consumer"


def apply_draft_script(script: np.ndarray, rounds: np.ndarray, lead, verified, cap) -> None:
    """Overwrite a plan's verify windows with a draft script (EngineConfig.draft_script as an
    int64 [J, 2] array: drafts verified, drafts accepted, per decode step of a request): slot r
    at step t of the plan is at its decode step rounds[r] + t (the last entry repeats beyond J).
    lead, verified, cap: [steps, n] (dsim.engine.compiled_step.plan_decodes' outputs), so the commit
    accepts min(lead, cap) = the script's accepted drafts and prices the verified ones."""
    steps = lead.shape[0]
    j = np.minimum(rounds[None, :] + np.arange(steps)[:, None], len(script) - 1)
    verified[:] = script[j, 0]
    cap[:] = script[j, 0]
    lead[:] = script[j, 1]


@dataclass(frozen=True)
class StepRecord:
    """What one engine step produced (the per-step table has one row of these per step)."""

    replica: int
    t_end_s: float
    duration_ms: float
    n_requests: int  # scheduled requests
    n_decode: int  # requests verifying/decoding
    n_tokens: int  # tokens in the target forward
    prefill_tokens: int
    verify_draft_tokens: int  # draft tokens verified
    accepted_tokens: int
    emitted_tokens: int
    kv_tokens: int
    n_waiting: int


STEP_FIELDS = tuple(StepRecord.__dataclass_fields__)
if STEP_FIELDS != KS.STEP_COLUMNS:  # (the compiled steps write the rows by these positions)
    raise ImportError(f"StepRecord's fields {STEP_FIELDS} are not the kernels' step columns {KS.STEP_COLUMNS}")
# The compiled runs' state record (dsim.engine.compiled_sched.RunState) as _run_steps_compiled writes and
# reads its int fields, in one operation each.
_RUN_INT_FIELDS = (
    "n", "n_pre", "w_head", "w_tail", "kv_dec", "pre_blocks", "admit_seq", "left_lb", "done_n", "last_is_prev_end",
    "n_steps", "batch_sum", "step_row", "step_row_end", "itl_row", "itl_row_end", "next_id", "head_n", "head_cap",
    "replica", "successors", "pending", "pending_cut", "pending_tokens", "pending_prefill_tokens", "pending_kv",
    "pending_chunked", "drafts", "draft_tokens", "verified", "in_window", "full_block",
)  # fmt: skip
_RUN_FLOAT_FIELDS = ("now", "prev_end", "t_next", "pending_forward_ms", "pending_duration_ms")
if KSched.RunState._fields != _RUN_INT_FIELDS + _RUN_FLOAT_FIELDS or KSched.RUN_STATE_INTS != len(_RUN_INT_FIELDS):
    raise ImportError(f"RunState's fields are not the engine's {_RUN_INT_FIELDS + _RUN_FLOAT_FIELDS}")
STEP_FLOAT_FIELDS = tuple(f for f, t in StepRecord.__annotations__.items() if t == "float")  # others: int


class StepPlan(NamedTuple):
    """What the scheduler planned for one step (a named record; a NamedTuple because one is made
    every step and a tuple is the cheapest record to build).

    The first ``n_decode`` decode slots decode (each 1 + its verified drafts, or ``decode_given``
    tokens where the token budget cut the queue); with drafts, their draws and verify windows
    are ``conf`` [1, K, n] (confidences), ``lead`` [1, n] (leading accepted drafts of the full
    block), ``verified`` and ``commit_cap`` [1, n] (the verify mode's drafts verified and commit
    cap). The running prefills ``prefill_ids`` compute ``prefill_chunks`` tokens (``n_prefill``
    of them at least one; the arrays are views of the replica's buffers, valid until its
    commit). ``kv_tokens``: KV entries the forward reads; ``forward_ms``: the target forward; ``duration_ms``: the
    step's wall time (forward + drafter + CPU overhead)."""

    n_decode: int
    decode_given: np.ndarray | None
    conf: np.ndarray | None
    lead: np.ndarray | None
    verified: np.ndarray | None
    commit_cap: np.ndarray | None
    prefill_ids: np.ndarray
    prefill_chunks: np.ndarray
    n_prefill: int
    n_tokens: int
    prefill_tokens: int
    kv_tokens: int
    forward_ms: float
    duration_ms: float


class DecodeOutcome(NamedTuple):
    """What ``steps`` steps produced for the ``n`` decode slots (in slot order): per request the
    drafts drafted (``drafted`` each step), verified, accepted (inside the commit cap) and
    committed tokens (accepted + 1 a step, capped by the request's remaining output; 0 for a
    decode the budget gave no token), and per step the totals (``step_emitted``: committed
    tokens). The arrays are views of the replica's commit buffers (``slot_out`` [3, >= n]:
    committed, verified, accepted; ``step_out`` [3, >= steps]: verified, accepted, emitted),
    valid until its next commit."""

    steps: int
    n: int
    drafted: int
    slot_out: np.ndarray
    step_out: np.ndarray
    total_verified: int
    total_accepted: int
    total_committed: int
    full_block_accepted: int

    @property
    def committed(self) -> np.ndarray:
        return self.slot_out[0, : self.n]

    @property
    def verified(self) -> np.ndarray:
        return self.slot_out[1, : self.n]

    @property
    def accepted(self) -> np.ndarray:
        return self.slot_out[2, : self.n]

    @property
    def step_verified(self) -> np.ndarray:
        return self.step_out[0, : self.steps]

    @property
    def step_accepted(self) -> np.ndarray:
        return self.step_out[1, : self.steps]

    @property
    def step_emitted(self) -> np.ndarray:
        return self.step_out[2, : self.steps]


class Requests:
    """Global per-request state arrays shared by all replicas of one simulation."""

    def __init__(self, workload):
        n = len(workload.prompt_tokens)
        self.n = n
        # The per-request state the compiled kernels read and write, as rows of two blocks (one
        # argument each: a compiled call pays for every array argument; rows in dsim.engine.compiled_sched):
        # int64 prompt, output, class, emissions (the commit kernel's), then the scheduler's
        # computed and generated tokens, KV blocks held while prefilling, admission number on its
        # replica (preemption victims), prefix-cache hit tokens, preemptions and a preempted
        # request's held speculative counters (rounds, accepted, verified); float64 largest ITL,
        # first token, last emission, admission time (NaN before the first).
        self.req_i = np.zeros((KSched.REQ_I_ROWS, n), dtype=np.int64)
        self.req_f = np.zeros((KSched.REQ_F_ROWS, n))
        (
            self.prompt,
            self.output,
            self.cls,
            self.emits,
            self.computed,
            self.generated,
            self.blocks,
            self.seq,
            self.cached_tokens,
            self.preemptions,
        ) = self.req_i[: KSched.HELD_ROUNDS]
        self.held_spec = self.req_i[KSched.HELD_ROUNDS :]  # [3, n]: zero unless preempted with counters
        self.itl_max, self.first_token, self.last_emit, self.admit = self.req_f
        self.prompt[:] = workload.prompt_tokens
        self.output[:] = workload.output_tokens
        self.cls[:] = workload.cls
        self.first_token[:] = np.nan
        self.admit[:] = np.nan
        self.arrival = np.full(n, np.nan)
        self.finish = np.full(n, np.nan)
        # (Python lists of the fixed lengths: submit's checks read one request at a time, and
        # indexing a list is several times cheaper than a numpy scalar.)
        self.prompt_l = self.prompt.tolist()
        self.output_l = self.output.tolist()
        self.cls_l = self.cls.tolist()
        self.longest_life = int((self.prompt + self.output).max()) if n else 0  # prompt + output tokens
        self.replica = np.full(n, -1, dtype=np.int64)
        self.latent = np.zeros(n)
        # Per request, the float32 rows its decode slot carries (a column of Replica._slot_rows; built by the
        # first replica; [requests, rows]): acceptance-model slot offsets, then the confidences of
        # its previous draft rounds (ones before its first; written back here when it is preempted).
        self.slot_rows: np.ndarray | None = None


class SpecStats:
    """Accumulators for speculative decoding outputs (vLLM counter form and per class)."""

    def __init__(self, k: int, n_classes: int, head_sample_cap: int = 60_000):
        self.k = k
        self.num_drafts = 0
        self.num_draft_tokens = 0  # vLLM counter: full K per draft round
        self.verified_draft_tokens = 0  # drafts actually verified (the window)
        # Histogram of accepted drafts per round (0..K), counted by the commit kernel;
        # accepted_per_pos derives from it.
        self.accepted_hist = np.zeros(max(k, 1) + 1, dtype=np.int64)
        # Verify utilization (SGLang/DSpark): drafts accepted within the chosen windows over drafts
        # the full block would have had accepted, from the same draws.
        self.accepted_in_window = 0
        self.accepted_full_block = 0
        self.cls_rounds = np.zeros(n_classes)
        self.cls_emitted = np.zeros(n_classes)
        self.cls_verify = np.zeros(n_classes)
        self.cap = head_sample_cap
        # The head's sample: each replica's first draft rounds in its own step order, up to an
        # equal share of the cap (set by the simulation: cap / replicas), so the sample does not
        # depend on how the replicas' steps interleave (window lengths); gathered replica by
        # replica at the end (head_conf, head_acc).
        self.replica_cap = head_sample_cap
        self.head_conf: list = []
        self.head_acc: list = []

    @property
    def accepted_per_pos(self) -> np.ndarray:
        """vLLM's counter form: rounds that accepted draft position j (1..K) = rounds with more
        than j - 1 accepted."""
        return self.accepted_hist[::-1].cumsum()[::-1][1:]


_LAST, _ITLMAX = range(2)  # float64 columns of Replica._slot_floats

# Decode-window length. A window is at most max_window steps and WINDOW_SLOTS decode slots x
# steps (its draws' arrays); an open-loop window stops drawing at the next arrival only where it
# would draw more than CHEAP_WINDOW_SLOTS slots x steps: an arrival cuts short the window of the
# one replica it is routed to, and below that many slots the draws it wastes cost less than the
# extra windows (a few tens of microseconds of Python each) that stopping at every arrival in the
# fleet makes.
WINDOW_SLOTS = 8192
CHEAP_WINDOW_SLOTS = 256


class Columns:
    """Rows of float64 columns appended in place (the step table, the ITL samples), stored
    column-major in blocks: ``a`` [columns, capacity] is the block being filled (``n`` rows so
    far); a full block is kept as it is and a new one, twice as large, started (nothing is ever
    copied to grow; the result tables read each column as one contiguous run per block). Rows
    appended one at a time wait in a flat ``array('d')`` (extending it by a row's tuple costs a
    fraction of a numpy row write) and are copied in before any reserve or read, so the rows
    keep their order. Not ``keep``: the rows are dropped as they are written (``a`` is scratch,
    re-used from row 0 by every reserve, ``append`` writes nothing), for callers that never read
    them: a full hour's million steps x 12 columns streamed through the cache slow every kernel
    that reads or writes other memory."""

    __slots__ = ("a", "n", "ncol", "keep", "_full", "_pending", "_np", "_last")
    PENDING = 256

    def __init__(self, ncol: int, cap: int = 64, keep: bool = True):
        self.a = np.empty((ncol, cap), dtype=np.float64)
        self.n = 0
        self.ncol = ncol
        self.keep = keep
        self._full: list = []  # the filled blocks, [columns, rows] views
        self._pending = array("d")
        self._np = 0  # rows waiting in _pending
        self._last = None  # the last row appended (a lone pending row is written from it)

    def _grow(self, m: int) -> int:
        if not self.keep:
            if m > self.a.shape[1]:
                self.a = np.empty((self.ncol, max(2 * self.a.shape[1], m)), dtype=np.float64)
            self.n = m
            return 0
        i = self.n
        if i + m > self.a.shape[1]:
            if i:
                self._full.append(self.a[:, :i])
            self.a = np.empty((self.ncol, max(2 * self.a.shape[1], m)), dtype=np.float64)
            i = 0
        self.n = i + m
        return i

    def _flush(self) -> None:
        m = self._np
        if m:
            i = self._grow(m)
            if m == 1:
                self.a[:, i] = self._last
            else:
                self.a[:, i : self.n] = np.frombuffer(self._pending, dtype=np.float64).reshape(m, self.ncol).T
            # (the frombuffer view is gone: the buffer may shrink)
            del self._pending[:]
            self._np = 0

    def reserve(self, m: int) -> int:
        """The index in ``a`` (the current block) of the first of m new rows (columns of ``a``,
        written by the caller; re-read ``a`` after reserving: it may be a new block)."""
        if self._np:
            self._flush()
        return self._grow(m)

    def release(self, end: int) -> None:
        """Of the rows reserved last, keep those before index ``end`` of ``a`` (the caller wrote
        fewer than it reserved)."""
        if self.keep:
            self.n = end

    def append(self, row) -> None:
        if not self.keep:
            return
        self._pending.extend(row)
        self._last = row
        self._np += 1
        if self._np >= self.PENDING:
            self._flush()

    def blocks(self) -> list:
        """The rows so far as column blocks, in order: views [columns, rows] (none when not kept)."""
        if not self.keep:
            return []
        self._flush()
        return [*self._full, self.a[:, : self.n]]


class DraftCost:
    """The drafter's cost (ms) of one step by decode batch size, for one method on one cost model
    (a simulation's replicas share one): sizes 0..n_max in one vectorized pass
    (SpecMethod.draft_ms_upto), the table the compiled steps read; any other size computed once
    when first asked. ms(n) == float(method.draft_ms(cost, n))."""

    def __init__(self, method: Any, cost: Any):
        self.method, self.cost = method, cost
        self.table = np.zeros(0)
        self._values: list[float] = []
        self._memo: dict[int, float] = {}

    def upto(self, n_max: int) -> np.ndarray:
        """The costs at sizes 0..n_max (at least; a float64 array)."""
        if len(self.table) <= n_max:
            self.table = np.asarray(self.method.draft_ms_upto(self.cost, n_max), dtype=np.float64)
            self._values = self.table.tolist()
        return self.table

    def ms(self, n: int) -> float:
        if n < len(self._values):
            return self._values[n]
        v = self._memo.get(n)
        if v is None:
            v = self._memo[n] = float(self.method.draft_ms(self.cost, n))
        return v


def _grown(old: np.ndarray, cap: int, keep: int, alloc) -> np.ndarray:
    """A (cap, columns) buffer from ``alloc`` (np.zeros or np.empty) holding old's first keep rows."""
    new = alloc((cap, old.shape[1]), dtype=old.dtype)
    new[:keep] = old[:keep]
    return new


# Prefix caching: admission looks up this many waiting requests' cached blocks at a time.
_HIT_BATCH = 16

# The compiled run of general steps, compiled in a background process where numba's cache lacks
# it (dsim.background_compile): its steps run from Python meanwhile, with the same results. Its
# Python path compiles schedule_step (alone or inside plan_general) and commit_step itself.
_RUN_STEPS_KERNEL = Deferred(KSched.run_general_steps, lambda: (KSched.schedule_step, KSched.commit_step))


class WaitQueue:
    """A replica's waiting queue (FCFS; a preempted request goes back to its head) as an int64
    buffer ``buf[head:tail]``, which the scheduling kernel consumes from the head in place
    (dsim.engine.compiled_sched.schedule_step returns the new head)."""

    def __init__(self, cap: int = 64):
        self.buf = np.empty(cap, dtype=np.int64)
        self.head = self.tail = cap // 4

    def __len__(self) -> int:
        return self.tail - self.head

    def __bool__(self) -> bool:
        return self.tail > self.head

    def ids(self) -> list:
        return self.buf[self.head : self.tail].tolist()

    def make_room(self, front: int, back: int) -> None:
        """At least front free entries before the head and back after the tail (recentred or
        grown)."""
        if self.head >= front and len(self.buf) - self.tail >= back:
            return
        n = self.tail - self.head
        cap = len(self.buf)
        if n + front + back + 16 > cap // 2:
            cap = 2 * (n + front + back + 16)
        head = front + (cap - n - front - back) // 4
        buf = np.empty(cap, dtype=np.int64) if cap != len(self.buf) else self.buf
        buf[head : head + n] = self.buf[self.head : self.tail].copy()
        self.buf, self.head, self.tail = buf, head, head + n

    def append(self, rid: int) -> None:
        if self.tail == len(self.buf):
            self.make_room(0, 1)
        self.buf[self.tail] = rid
        self.tail += 1

    def extend(self, rids) -> None:
        k = len(rids)
        if self.tail + k > len(self.buf):
            self.make_room(0, k)
        t = self.tail
        if k <= 8:  # (a closed loop's few successors: items, cheaper than an array's slice)
            buf = self.buf
            for r in rids:
                buf[t] = r
                t += 1
            self.tail = t
        else:
            self.buf[t : t + k] = np.arange(rids.start, rids.stop, rids.step) if isinstance(rids, range) else rids
            self.tail = t + k

    def appendleft(self, rid: int) -> None:
        if self.head == 0:
            self.make_room(1, 0)
        self.head -= 1
        self.buf[self.head] = rid


class Replica:
    """One engine replica driven by a simpy process.

    The running queue is (decode slots) + (requests still prefilling, in admission order).
    Decodes are scheduled before prefills, as vLLM's FCFS queue does when older requests are
    decoding; preemption picks the most recently admitted request by its admission number, since
    with long_prefill_token_threshold a newer short prompt can decode while an older one still
    prefills. Decode slots are buffers with room for ``capacity`` slots, the first ``n`` live:
    the int table ``_slot_ints`` [capacity, NCOL] (columns in dsim.engine.compiled_step), the float
    table ``_slot_floats`` (last emission, largest ITL) and the float32 rows ``_slot_rows``
    [rows, capacity] (position-major: the acceptance model's slot offsets, then the confidences of
    the previous draft round from row ``_hist_row`` and, where the budget policy reads them, of
    the one before from ``_hist2_row``), together the kernels' ``SlotTable``. The compiled kernels
    work on these buffers in place; so do the scheduler's (dsim.engine.compiled_sched) on the request
    table, the prefilling requests' buffer (pre_ids[:n_pre], queue order) and the waiting
    queue's. The kernels take them as the named bundles of dsim.engine.compiled_step and
    dsim.engine.compiled_sched: those fixed for the run built once here (``_draws``, ``_policy``,
    ``_limits``, ``_pricing``, ``_step_costs``, ``_context_args``), those of buffers that grow
    built again when a buffer grows (``_slots``, ``_commit_out``, ``_queues()``).
    ``K`` is the method's drafts per step (0 without speculation), ``requests`` the
    simulation's shared request table.
    """

    # A speculative general step's schedule, cost row and draws in one compiled call where it can
    # (dsim.engine.compiled_sched.plan_general); False: schedule_step and plan_decodes called apart (the
    # same results: tests/test_engine.py).
    fuse_plan = True
    # Consecutive general steps as one compiled call where they can (dsim.engine.compiled_sched.
    # run_general_steps); False: each step planned and committed from Python (the same results:
    # tests/test_engine.py).
    run_compiled = True
    _RUN_STEPS = 256  # step rows a compiled run reserves (it stops when they are used up)

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
        self.key = int(draw_key)  # the draws' run key (dsim.engine.compiled_step)
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
        # The bundles the compiled kernels take (dsim.engine.compiled_step, dsim.engine.compiled_sched), built once
        # where they are fixed for the run; every bundle travels as a plain tuple (see
        # dsim.engine.compiled_step's "named bundles").
        head, *draw_f = acc.kernel_params() if K else (KS.HEAD_MODEL, 0.0, 0.0, 0.0, 0.0, 0.0)
        self._draws = tuple(KS.DrawParams(self.key, int(head), *(float(x) for x in draw_f)))
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
        self._verify_mode = KS.VERIFY_CODES[spec.verify_mode] if K else KS.COMPACT
        # A window's later steps read more KV: their budgets' cost rises by this per token of
        # context emitted before them (0 for a policy whose cost table fixes the context).
        self._context_ms_per_tok = cost.kv_ms_per_tok if pol is not None and pol.prices_context else 0.0
        self._policy = tuple(
            KS.PolicyParams(
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
        self._context_args = tuple(KS.ContextArgs(*KS.pack_context_args(cost.context_args())))
        self._context_packed = cost.request_attention is not None  # (see _context_ms)
        # A decode window's per-step shape (dsim.engine.compiled_step.window_steps' rows), reused.
        self._window_ints = np.empty((3, max(1, cfg.max_window)), dtype=np.int64)
        self._window_floats = np.empty((5, max(1, cfg.max_window)), dtype=np.float64)
        self._script = None
        if K and cfg.draft_script is not None:
            sc = np.asarray(cfg.draft_script, dtype=np.int64).reshape(-1, 2)
            if self._adaptive or not len(sc) or (sc < 0).any() or (sc[:, 1] > sc[:, 0]).any() or (sc[:, 0] > K).any():
                raise InputError(
                    f"draft_script: needs a non-adaptive method and entries 0 <= accepted <= verified <= K = {K}"
                )
            self._script = sc
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
            KSched.SchedLimits(
                K, self.lookahead, int(self.total_blocks), cfg.max_num_batched_tokens, cfg.long_prefill_token_threshold,
                cfg.max_num_seqs, bool(self._kv_consumer),
            )
        )  # fmt: skip
        self._pricing = (
            tuple(
                KSched.RowPricing(
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
        self.successors = KSched.SUCC_PYTHON
        self.closed_next = np.zeros(1, dtype=np.int64)
        self._setup_steps_compiled()
        self.proc = env.process(self.loop())

    # ---- decode-slot buffers ----------------------------------------------------------------
    @property
    def live_ints(self) -> np.ndarray:
        """The live decode slots' int rows (columns ID .. VSUM of dsim.engine.compiled_step)."""
        return self._slot_ints[: self.n]

    @property
    def live_floats(self) -> np.ndarray:
        """The live decode slots' last emission (s) and largest ITL (ms)."""
        return self._slot_floats[: self.n]

    # The bundles of buffers that grow, as plain tuples (see __init__), rebuilt when one grows.
    def _bundle_buffers(self) -> None:
        """self._slots (dsim.engine.compiled_step.SlotTable) and self._commit_out (CommitOut) of the
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
        self._slot_ints, self._slot_floats = (_grown(a, cap, n, np.zeros) for a in (self._slot_ints, self._slot_floats))
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
        self._done_ints, self._done_floats = (
            _grown(a, cap, d0, np.empty) for a in (self._done_ints, self._done_floats)
        )

    def _remove_slot(self, j: int):
        n = self.n
        self._slot_ints[j : n - 1] = self._slot_ints[j + 1 : n]
        self._slot_floats[j : n - 1] = self._slot_floats[j + 1 : n]
        if self.K:
            self._slot_rows[:, j : n - 1] = self._slot_rows[:, j + 1 : n]
        self.n = n - 1

    # ---- interface used by the router -------------------------------------------------------
    @property
    def outstanding(self) -> int:
        return self.n + self.n_pre + len(self.waiting) + self.in_transit

    def submit(self, rid: int) -> None:
        R = self.requests
        # A request whose whole life cannot fit the KV cache would be preempted forever (vLLM
        # refuses to start with max_model_len above the cache): say so on arrival.
        if R.prompt_l[rid] + R.output_l[rid] > self._fit_tokens:
            self._too_big(rid)
        R.replica[rid] = self.idx
        if self._transit_delay:
            cfg = self.cfg
            delay_ms = cfg.remote_prefill_ms + cfg.remote_prefill_ms_per_ktok * R.prompt_l[rid] / 1000.0
            self.in_transit += 1
            self.env.timeout(delay_ms / 1000.0).callbacks.append(lambda _, rid=rid: self._arrive(rid, True))
            return
        self._arrive(rid, False)

    def submit_many(self, rids) -> None:
        """submit(rid) for each of rids in turn (a range or list of request ids)."""
        if self._transit_delay:
            for rid in rids:
                self.submit(rid)
            return
        R = self.requests
        if R.longest_life > self._fit_tokens:  # (some request of the run may not fit: check these)
            prompt_l, output_l, lim = R.prompt_l, R.output_l, self._fit_tokens
            for rid in rids:
                if prompt_l[rid] + output_l[rid] > lim:
                    self._too_big(rid)
        if len(rids) == 1:  # (the closed loop's usual one: an item, cheaper than a slice)
            R.replica[rids[0]] = self.idx
        elif isinstance(rids, range) and rids.step == 1:
            R.replica[rids.start : rids.stop] = self.idx
        else:
            R.replica[list(rids)] = self.idx
        self.waiting.extend(rids)
        if not self.wake.triggered:
            self.wake.succeed()

    def _too_big(self, rid: int) -> None:
        R = self.requests
        need = -(-(R.prompt_l[rid] + R.output_l[rid] - 1 + self.lookahead) // KV_BLOCK_TOKENS)
        raise InputError(
            f"request {rid}: {R.prompt_l[rid]} prompt + {R.output_l[rid]} output tokens "
            f"need {need} KV blocks, the cache holds {self.total_blocks} "
            f"(profile memory.kv_cache_gib)"
        )

    def _arrive(self, rid: int, transit: bool) -> None:
        """rid joins the waiting queue (for a decode instance: its prompt's KV has arrived)."""
        self.in_transit -= transit
        self.waiting.append(rid)
        if not self.wake.triggered:
            self.wake.succeed()

    # ---- helpers ----------------------------------------------------------------------------
    def _draft_ms(self, n: int) -> float:
        if self.K == 0 or n == 0:
            return 0.0
        return self.draft_cost.ms(n)

    def _prefix_hit_blocks(self, rid: int) -> int:
        """Leading full blocks of rid's prompt whose hashes some request has already computed on
        this replica (a look-up only: the LRU order is _prefix_touch's). Only full blocks can be
        shared: the last hash may cover a partial block."""
        cache = self.prefix_cache
        hit = 0
        for h in self.prefix_hashes[rid][: self.requests.prompt_l[rid] // self.prefix_block_tokens]:
            if int(h) not in cache:
                break
            hit += 1
        return hit

    def _prefix_hits(self, start: int, k: int) -> tuple:
        """The cached prompt tokens of the waiting queue's entries start..start + k - 1, for
        admission (vLLM never serves the whole prompt from cache: the last token is recomputed),
        and their hit blocks."""
        R, bt = self.requests, self.prefix_block_tokens
        ids = self.waiting.buf[start : start + k].tolist()
        hb = [self._prefix_hit_blocks(r) for r in ids]
        return np.array([min(h * bt, R.prompt_l[r] - 1) for r, h in zip(ids, hb)], dtype=np.int64), hb

    def _prefix_touch(self, rid: int, hit_blocks: int) -> None:
        """The LRU's move to the end of rid's hit blocks (admission looked it up)."""
        cache = self.prefix_cache
        for h in self.prefix_hashes[rid][:hit_blocks]:
            cache.move_to_end(int(h))

    def _prefix_insert(self, rid: int, computed: int):
        """Register rid's prompt blocks that are now fully computed (and only those)."""
        hashes = self.prefix_hashes[rid]
        full = min(computed, int(self.requests.prompt_l[rid])) // self.prefix_block_tokens
        for h in hashes[:full]:
            h = int(h)
            if h in self.prefix_cache:
                self.prefix_cache.move_to_end(h)
            else:
                self.prefix_cache[h] = True
        while len(self.prefix_cache) > self.prefix_cap:
            self.prefix_cache.popitem(last=False)

    # ---- consecutive general steps, compiled --------------------------------------------------
    def _setup_steps_compiled(self) -> None:
        """Whether consecutive general steps can run as one compiled call (the preconditions of
        dsim.engine.compiled_sched.run_general_steps that hold for the whole run), and its static
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
        self._run_state = np.zeros(1, dtype=KSched.RUN_STATE)
        # its int64 and float64 fields as two arrays, each written and read in one operation
        # (_RUN_INT_FIELDS' order, checked against RunState's on import)
        self._run_ints = self._run_state.view(np.int64)[: KSched.RUN_STATE_INTS]
        self._run_floats = self._run_state.view(np.float64)[KSched.RUN_STATE_INTS :]
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
        """General steps from now as one compiled call (dsim.engine.compiled_sched.run_general_steps):
        the replica's state in, its steps' records and counters written, its state back. Returns
        (why it stopped, the StepPlan of a planned step not yet committed or None)."""
        env, R, K, cfg = self.env, self.requests, self.K, self.cfg
        seqs = cfg.max_num_seqs
        if self._draft_tab is None:  # the drafter's cost at every batch size a step can have
            self._draft_tab = self.draft_cost.upto(seqs) if self.K else np.zeros(seqs + 1)
            cost = self.cost
            self._step_costs = tuple(
                KSched.StepCosts(
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
        if not _RUN_STEPS_KERNEL.ready(args):  # (compiling in the background: this step from Python)
            steps.release(i0)
            itl.release(j0)
            return KSched.STOP_PYTHON, None
        stop, conf, lvc, given, cut, n_tokens, pre_tokens, kv, fwd, dur, n_chunked, d0 = KSched.run_general_steps(*args)
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
        if stop == KSched.STOP_FINISHED:
            self.on_finish(self._done_ints[d0 : self._done_n, ID].tolist())
        if stop != KSched.STOP_PLANNED:
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

    # ---- the step loop ----------------------------------------------------------------------
    def loop(self) -> Generator[Any, Any, None]:
        env = self.env
        compiled = True
        while True:
            # (a step the compiled run planned and this loop waited on is committed by the next
            # run, before anything else)
            pending = self._run_pending is not None
            if not pending and self.n == 0 and not self.n_pre and not self.waiting:
                self.wake = env.event()
                yield self.wake
            if not pending and self._window_ok():
                yield from self._decode_window()
                continue
            plan = None
            if pending or (
                compiled
                and self._steps_compiled
                and self.wake.triggered
                and self._run_pays()
                and _RUN_STEPS_KERNEL.usable()
            ):
                stop, plan = self._run_steps_compiled()
                if stop in (KSched.STOP_WINDOW, KSched.STOP_IDLE, KSched.STOP_FINISHED, KSched.STOP_ROOM):
                    # (the loop's own checks next; should they disagree, one step from Python)
                    compiled = stop in (KSched.STOP_FINISHED, KSched.STOP_ROOM)
                    continue
            compiled = True
            planned = plan is not None  # (the compiled run's: it commits it too)
            if plan is None:  # (or the compiled run's step that needs Python: it runs here)
                plan = self._plan_step()
            if plan is None:  # nothing could be scheduled: wait for an event
                self.wake = env.event()
                yield self.wake
                continue
            self._step_s = plan.duration_ms / 1000.0
            if not self._skip(self._step_s):
                yield env.timeout(self._step_s)
            if planned and self._run_pays():  # (else Python commits the run's StepPlan)
                self._run_pending = self._run_planned
                continue
            self._commit_step(plan)

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

    def _preempt_tail(self):
        """Preempt the request at the tail of the running queue, i.e. the most recently admitted
        one (recompute later). Prefilling requests are in admission order; with
        long_prefill_token_threshold a newer short prompt can be decoding while an older long one
        still prefills, so the decode slots are compared too."""
        R = self.requests
        j = None
        if self.n:
            seqs = R.seq[self._slot_ints[: self.n, ID]]
            j = int(np.argmax(seqs))
        if self.n_pre and (j is None or R.seq[self.pre_ids[self.n_pre - 1]] > seqs[j]):
            self.n_pre -= 1
            rid = int(self.pre_ids[self.n_pre])
            self.pre_blocks -= int(R.blocks[rid])
        else:
            row, frow = self._slot_ints[j].copy(), self._slot_floats[j].copy()
            rid = int(row[ID])
            R.generated[rid] = R.output_l[rid] - int(row[END] - row[COMP])
            R.emits[rid] = row[EMITS]
            R.held_spec[:, rid] = row[ROUNDS : VSUM + 1]
            R.last_emit[rid] = self.prev_end if self._last_is_prev_end else frow[_LAST]
            R.itl_max[rid] = frow[_ITLMAX]
            self.kv_dec -= int(row[COMP])
            if self.K:
                R.slot_rows[rid] = self._slot_rows[:, j]  # its confidences, kept for its resumption
            self._remove_slot(j)
        R.blocks[rid] = 0
        R.computed[rid] = 0
        R.preemptions[rid] += 1
        self.waiting.appendleft(rid)

    def _dec_blocks_bound(self) -> int:
        """An upper bound on the decode slots' KV blocks from kv_dec alone (sum of ceil(x_i / 16)
        <= (sum x_i + 15 n) / 16; the exact count is the scheduler kernels')."""
        return (self.kv_dec + self.n * (self.lookahead + KV_BLOCK_TOKENS - 1)) // KV_BLOCK_TOKENS

    def _plan_step(self) -> StepPlan | None:
        """Schedule one step (vLLM V1 order), or None if nothing runs.

        vLLM schedules decodes first, each reserving 1 + K tokens (drafts the verify budget trims
        do not return theirs); the running prefills take what is left in queue order, their KV
        blocks grow (a preemption from the tail where the cache cannot hold them, then the step
        is scheduled again without admission), and FCFS admission fills the rest while budget,
        max_num_seqs and blocks allow (dsim.engine.compiled_sched.schedule_step). The decodes' draws and
        verify budgets are priced with the running prefills' chunks only (those admitted this
        step are not in the price)."""
        cfg, K = self.cfg, self.K
        budget = cfg.max_num_batched_tokens
        wq = self.waiting
        prefix = self._prefix_on
        hits, n_hits, hit_blocks = self._no_hits, -1, None
        admit = True
        fused = drawn = False
        while True:
            n_dec, n_run = self.n, self.n_pre
            fused = self._plan_fused and n_dec > 0
            head = wq.head
            room = cfg.max_num_seqs - n_dec - n_run  # (admission's bounds, known before the kernel)
            if prefix and admit and wq and room > 0 and budget > n_dec * (1 + K):
                hits, hit_blocks = self._prefix_hits(head, min(len(wq), _HIT_BATCH, room + 1))
                n_hits = len(hits)
            if fused:
                # the schedule and the decodes' draws and verify windows in one call
                conf = np.empty((1, K, n_dec), dtype=np.float32)
                lvc = np.empty((3, 1, n_dec), dtype=np.int64)
                lead, verified, cap = lvc[0], lvc[1], lvc[2]
            # a SchedStep (a plain tuple: see dsim.engine.compiled_step; simpy's clock starts as int 0: one
            # type, one compile)
            step = (n_run, head, wq.tail, n_dec, self.kv_dec, self.pre_blocks, self.admit_seq, float(self.env.now),
                    admit, hits, n_hits)  # fmt: skip
            if fused:
                st, run_tokens, n_pre, w_head, pre_blocks, admit_seq, pre_tokens, n_sampling, kv_pre, seen, drawn, v0 = (
                    KSched.plan_general(
                        self._request_table, self._queues(), self._slots, self._limits, step, self._draws,
                        self._policy, self._pricing, self.cpu_ms + self._draft_ms(n_dec), (conf, lead, verified, cap),
                    )
                )  # fmt: skip
            else:
                st, run_tokens, n_pre, w_head, pre_blocks, admit_seq, pre_tokens, n_sampling, kv_pre, seen = (
                    KSched.schedule_step(self._request_table, self._queues(), self._slots, self._limits, step)
                )
            if st != KSched.PREEMPT:
                break
            # (a lone request always fits: submit() checked its whole life against the cache)
            assert n_dec + n_run > 1, "KV accounting: a lone request does not fit"
            self._preempt_tail()
            admit = False
        if prefix and seen:
            pre_tokens, n_sampling, kv_pre = self._admit_prefix_hits(
                st, head, seen, hit_blocks, pre_tokens, n_sampling, kv_pre, n_pre, w_head, pre_blocks, admit_seq
            )
            n_pre, w_head, pre_blocks, admit_seq = self.n_pre, wq.head, self.pre_blocks, self.admit_seq
        self.n_pre, wq.head, self.pre_blocks, self.admit_seq = n_pre, w_head, pre_blocks, admit_seq
        if not fused:
            conf = lead = verified = cap = None
        given = None
        dec_tokens = 0
        if n_dec:
            if K:
                if not drawn:  # the verify budget, priced with the running prefills' chunks
                    conf, lead, verified, cap, v0, _ = self._draft_and_verify(1, run_tokens, self._prefill_ms(n_run))
                elif self._script is not None:
                    apply_draft_script(self._script, self._slot_ints[:n_dec, ROUNDS], lead, verified, cap)
                    v0 = int(verified[0].sum())
                dec_tokens = n_dec + v0
            else:
                dec_tokens = n_dec
            if dec_tokens > budget:  # the budget cuts the decode queue (rare)
                qq = 1 + verified[0] if K else np.ones(n_dec, dtype=np.int64)
                cum = np.cumsum(qq)
                given = np.minimum(qq, np.maximum(budget - (cum - qq), 0))
                dec_tokens = budget
        n_tokens = dec_tokens + pre_tokens
        if n_tokens == 0:
            return None
        kv = self.kv_dec + dec_tokens + kv_pre
        n_sample = (n_dec if given is None else int(np.count_nonzero(given))) + n_sampling
        fwd = self.cost.step_ms_one(n_tokens, kv)
        if self._step_terms:  # (profiles with prefill or per-request attention terms)
            fwd = fwd + self._prefill_ms(n_pre) + self._context_ms(given, verified, n_pre)
        dur = fwd + self._draft_ms(n_sample) + self.cpu_ms
        ids, chunks = self.pre_ids[:n_pre], self.chunks[:n_pre]
        n_chunked = n_pre if not n_run or chunks[n_run - 1] else int(np.count_nonzero(chunks))
        return StepPlan(
            n_dec, given, conf, lead, verified, cap, ids, chunks, n_chunked, n_tokens, pre_tokens, kv, fwd, dur
        )

    def _admit_prefix_hits(
        self, st, head, seen, hit_blocks, pre_tokens, n_sampling, kv_pre, n_pre, w_head, pre_blocks, admit_seq
    ) -> tuple:
        """Admission with prefix caching, after schedule_step's first batch of looked-up hits:
        the next batches while it asks for more (MORE_HITS), then the LRU's move to the end of
        every considered candidate's hit blocks, in queue order (as looking each up in turn
        would: admission never changes which blocks are cached). Leaves the queue, pre_ids and
        counters updated; returns (prefill tokens, prefills sampling a token, KV tokens read)."""
        cfg, wq = self.cfg, self.waiting
        touched = hit_blocks[:seen]
        left0 = max(cfg.max_num_batched_tokens - self.n * (1 + self.K), 0)
        while st == KSched.MORE_HITS:
            hits, hb = self._prefix_hits(w_head, min(wq.tail - w_head, _HIT_BATCH))
            dec_bound = self.total_blocks - self._dec_blocks_bound()
            step = (n_pre, w_head, wq.tail, self.n, self.kv_dec, pre_blocks, admit_seq, float(self.env.now), True, hits,
                    len(hits))  # (a SchedStep)  # fmt: skip
            st, n_pre, w_head, pre_blocks, admit_seq, left, n_sampling, kv_pre, seen = KSched.admit_waiting(
                self._request_table, self._queues(), self._slots, self._limits, step, dec_bound, left0 - pre_tokens,
                self.n + n_pre, n_sampling, kv_pre,
            )  # fmt: skip
            pre_tokens = left0 - left
            touched += hb[:seen]
        for rid, h in zip(wq.buf[head : head + len(touched)].tolist(), touched):
            self._prefix_touch(rid, h)
        self.n_pre, wq.head, self.pre_blocks, self.admit_seq = n_pre, w_head, pre_blocks, admit_seq
        return pre_tokens, n_sampling, kv_pre

    def _prefill_ms(self, k: int) -> float:
        """The cost correction (CostModel.prefill_ms) of the first k prefills' chunks this step."""
        if not self.cost.has_prefill_terms or not k:
            return 0.0
        R = self.requests
        return self.cost.prefill_ms(
            (c, comp) for c, comp in zip(self.chunks[:k].tolist(), R.computed[self.pre_ids[:k]].tolist()) if c
        )

    def _context_ms(self, given, verified, k: int = 0) -> float:
        """CostModel.context_ms of the decode slots this step (their windows: the budget's cut
        `given`, else 1 + verified[0]) with the first k prefills' chunks this step; 0 for
        profiles without per-request attention terms."""
        if not self.cost.has_context_terms or not self.n:
            return 0.0
        reads_chunks = self.cost.context_reads_chunks and k and self.chunks[:k].any()
        if given is None and self._context_packed and not reads_chunks:
            # (the compiled call CostModel.context_ms makes here, on the same values)
            return KS.slots_context_ms(
                self._slot_ints, self.n, self.K, verified if self.K else self._no_steps, self._context_args
            )
        ctx = self.live_ints[:, COMP]
        pre = (
            [
                (c, comp)
                for c, comp in zip(self.chunks[:k].tolist(), self.requests.computed[self.pre_ids[:k]].tolist())
                if c
            ]
            if reads_chunks
            else ()
        )
        if given is not None:
            run = given > 0
            return self.cost.context_ms(given[run], ctx[run], pre)
        return self.cost.context_ms(1 + verified[0] if self.K else np.ones(self.n, np.int64), ctx, pre)

    def _cost_row(self, N: int, limit: int):
        """The adaptive budget policies' cost row of a step of N non-draft tokens (n decode slots
        and the step's prefill tokens) at the slots' KV context, drafter and CPU overhead
        included."""
        n = self.n
        M = min(max(limit - N, 0), n * self.K)
        row = self.cost.step_cost_row(N, N + M + 1, self.kv_dec + n, self.cpu_ms + self._draft_ms(n))
        return self.spec.policy.cost_row(n, N, N + M + 1, row)

    def _plan_args(self, steps: int, tokens: int, extra_ms: float):
        """The output buffers and the arguments of dsim.engine.compiled_step.plan_decodes for up to
        `steps` steps of the decode slots, the budget priced for a step of `tokens` tokens with
        `extra_ms` beside the forward (its prefill chunks): (conf [steps, K, n], lead / verified /
        cap as one [3, steps, n] block, the argument tuple; plan_window takes the same first)."""
        n, K = self.n, self.K
        conf = np.empty((steps, K, n), dtype=np.float32)
        lvc = np.empty((3, steps, n), dtype=np.int64)  # (indexed: cheaper than unpacking)
        limit = self.cfg.max_num_batched_tokens
        row = self._cost_row(tokens, limit) if self._adaptive else self._no_row
        budget = (row, float(extra_ms), tokens, limit)  # (a BudgetRow)
        plan = (conf, lvc[0], lvc[1], lvc[2])  # (a DecodePlan)
        return conf, lvc, (self._slots, n, K, steps, self._draws, self._policy, budget, plan)

    def _draft_and_verify(self, steps: int, prefill_tokens: int = 0, prefill_ms: float = 0.0):
        """Draws and verify windows of the decode slots over ``steps`` steps (the compiled
        dsim.engine.compiled_step.plan_decodes). Adaptive: each step's budgets priced by one cost row,
        the cost of n + prefill_tokens + b tokens at the slots' KV context, drafter and CPU
        overhead included, plus prefill_ms (the step's prefill correction). Returns
        (conf [steps, K, n], lead, verified, commit cap [steps, n], drafts verified in the first
        step, steps planned: up to the first step where some slot may finish)."""
        conf, lvc, args = self._plan_args(steps, self.n + prefill_tokens, prefill_ms)
        lead, verified, cap = lvc[0], lvc[1], lvc[2]
        v0, done = KS.plan_decodes(*args)
        if self._script is not None:
            apply_draft_script(self._script, self._slot_ints[: self.n, ROUNDS], lead, verified, cap)
            v0 = int(verified[0].sum())
        return conf, lead, verified, cap, v0, done

    # ---- commit: one path for single steps and decode windows ---------------------------------
    def _grow_steps(self, m: int) -> None:
        """The commit kernels' per-step output buffer, grown to m steps."""
        if self._step_out.shape[1] < m:
            self._step_out = np.empty((3, m), dtype=np.int64)
            self._bundle_buffers()

    def _account(self, m: int, conf, lead, vt: int, at: int, lt: int, et: int, min_left: int) -> None:
        """After a commit of m steps: the speculative counters, the head's samples, the slots' KV
        tokens and the bound on the smallest remaining output (the confidence history is the
        commit kernels')."""
        n, K = self.n, self.K
        st = self.stats
        if K:
            st.num_drafts += m * n
            st.num_draft_tokens += m * n * K
            st.verified_draft_tokens += vt
            if self._adaptive:
                st.accepted_in_window += at
                st.accepted_full_block += lt
            if self._has_head and self.head_n < st.replica_cap:
                # this replica's first draft rounds up to its share of the cap, in step order:
                # the same samples whether the steps ran one by one or as windows
                q = min(m * n, -(-(st.replica_cap - self.head_n) // K)) * K
                self.head_conf.append(conf[:m].transpose(0, 2, 1).reshape(-1)[:q])
                self.head_acc.append((np.arange(K)[None, None, :] < lead[:m, :, None]).reshape(-1)[:q])
                self.head_n += q
        self.kv_dec += et
        self.left_lb = int(min_left)

    def _commit_step(self, plan: StepPlan) -> DecodeOutcome:
        """A general step's commit, one compiled call (dsim.engine.compiled_sched.commit_step): its
        prefills' chunks (those that reach the end of their prompt sample a token and become
        decode slots, their KV holding prompt + generated - 1 tokens), its decode slots
        (commit_decodes: tokens, speculative counters, the confidence history), their ITL samples
        where some gap is not the step's duration, the new slots and the removal of finished
        slots; then the prefix cache's new blocks, a resumed request's ITL sample (after the
        decodes'), the speculative counters and the head's samples (_account) and the step's
        row. Where every slot emitted at the previous step's end and the budget cut nothing,
        every gap is the step's duration: one run-length ITL sample (the kernel's itl_ms). The
        removed requests' rows follow the earlier ones in self._done_ints (flush writes them)."""
        R, t = self.requests, self.env.now
        n, K = self.n, self.K
        given = plan.decode_given
        chunks = plan.prefill_chunks
        n_pre = len(chunks)
        if self.shapes is not None:
            qd = given if given is not None else (1 + plan.verified[0] if K and n else None)
            qs = ([] if not n else (qd.tolist() if qd is not None else [1] * n)) + chunks.tolist()
            ctxs = self.live_ints[:, COMP].tolist() + R.computed[plan.prefill_ids].tolist()
            self.shapes.append((self.idx, t, [x for x in qs if x], [c for x, c in zip(qs, ctxs) if x], plan.forward_ms))
        if K and n:
            verified, cap, lead, conf = plan.verified, plan.commit_cap, plan.lead, plan.conf
        else:
            verified = cap = lead = self._no_steps  # (the kernel reads none without drafts)
            conf = self._no_conf
        itl_mode, j, itl_ms = 0, 0, -1.0
        v = self.itl_vals
        n_run = n
        if n:
            if given is None and self._last_is_prev_end:
                itl_ms = plan.duration_ms
                v.append((itl_ms, n))
            else:
                n_run = n if given is None else int(np.count_nonzero(given))
                itl_mode = 2 if self._last_is_prev_end else 1
                j = v.reserve(n_run)
                self._last_is_prev_end = given is None
        if given is None:
            given = self._no_cut
        if n_pre and n + n_pre > len(self._slot_ints):
            self._grow_slots(n + n_pre)
        d0 = self._done_n
        if d0 + n + n_pre > len(self._done_ints):
            self._grow_done(d0 + n + n_pre)
        if n_pre and self._prefix_on:
            done_ids, done_chunks = plan.prefill_ids.tolist(), chunks.tolist()  # (before the kernel moves them)
        step = (n_pre, itl_mode, itl_ms, float(t), float(self.prev_end), v.a, j, self.left_lb, self._moved, self._late,
                self._done_ints, self._done_floats, d0)  # (a CommitStep)  # fmt: skip
        vt, at, lt, et, w, d, ml, done_kv, m, freed, kv_new, self.n_pre, n_late = KSched.commit_step(
            self._slots, n, K, (conf, lead, verified, cap), given, self._commit_out, self._policy,
            self._request_table, self._queues(), step,
        )  # fmt: skip
        if n_pre:
            if self._prefix_on:
                computed = R.computed
                for rid, c in zip(done_ids, done_chunks):
                    if c:
                        self._prefix_insert(rid, int(computed[rid]))
            self.pre_blocks -= freed
            self.kv_dec += kv_new
            for gap in self._late[:n_late].tolist():
                self.itl_vals.append((gap, 1))
        if n:
            self._account(1, conf, lead, vt, at, lt, et, ml)
        self.left_lb = int(ml)
        self.kv_dec -= done_kv
        self.n = w
        self._done_n = d0 + d
        self.prev_end = t
        n_req = n_run + plan.n_prefill
        self.n_steps += 1
        self.batch_sum += n_req
        self.steps.append(
            (
                self.idx,
                t,
                plan.duration_ms,
                n_req,
                n_run,
                plan.n_tokens,
                plan.prefill_tokens,
                vt,
                at,
                et + m,
                plan.kv_tokens,
                len(self.waiting),
            )
        )
        if d:
            # Per-request results are written to the request table once, at the end (flush).
            self.on_finish(self._done_ints[d0 : d0 + d, ID].tolist())
        if not n:  # (no decodes: the commit wrote no per-step totals)
            self._step_out[:, 0] = 0
        return DecodeOutcome(1, n, K, self._slot_out, self._step_out, vt, at, et, lt)

    def _finish_done(self):
        if not self.n or self.left_lb > 0:
            return
        n, d0 = self.n, self._done_n
        self._grow_done(d0 + n)
        w, d, min_left, done_kv = KS.remove_done(
            self._slots, n, self._done_ints, self._done_floats, d0, float(self.env.now)
        )
        self.n = w
        self.left_lb = int(min_left)
        if d:
            # Per-request results are written to the request table once, at the end (flush).
            self._done_n = d0 + d
            self.kv_dec -= done_kv
            self.on_finish(self._done_ints[d0 : d0 + d, ID].tolist())

    def flush(self) -> None:
        """Write the finished requests' results into the shared request table; add every
        request's speculative counters (finished and still running) to the per-class totals."""
        R = self.requests
        st = self.stats
        if self.K:
            parts = [self._done_ints[: self._done_n], self.live_ints]
            held = np.flatnonzero(R.held_spec.any(axis=0))  # preempted and not resumed (any replica's)
            if len(held):
                rows = np.zeros((len(held), NCOL), dtype=np.int64)
                rows[:, CLS] = R.cls[held]
                rows[:, ROUNDS : VSUM + 1] = R.held_spec[:, held].T
                parts.append(rows)
                R.held_spec[:, held] = 0  # counted now
            allr = np.concatenate(parts)
            nc = len(st.cls_rounds)
            cls = allr[:, CLS]
            rounds = allr[:, ROUNDS].astype(np.float64)
            st.cls_rounds += np.bincount(cls, weights=rounds, minlength=nc)
            st.cls_emitted += np.bincount(cls, weights=rounds + allr[:, ASUM], minlength=nc)
            st.cls_verify += np.bincount(cls, weights=rounds + allr[:, VSUM], minlength=nc)
            self.live_ints[:, ROUNDS : VSUM + 1] = 0  # counted now
        rows, frows = self._done_ints[: self._done_n], self._done_floats[: self._done_n]
        ids = rows[:, ID]
        R.finish[ids] = frows[:, 2]
        R.emits[ids] = rows[:, EMITS]
        R.itl_max[ids] = frows[:, _ITLMAX]
        self._done_n = 0

    # ---- decode windows ---------------------------------------------------------------------
    def _window_ok(self) -> bool:
        n = self.n
        if n == 0 or self.n_pre:
            return False
        if self.waiting and n < self.cfg.max_num_seqs:
            return False
        if not self._last_is_prev_end and self.live_floats[:, _LAST].min() < self.prev_end:
            return False  # someone was skipped last step
        return n * (1 + self.K) <= self.cfg.max_num_batched_tokens

    def _window_pricing(self, fixed_ms: float) -> tuple:
        """What prices a window's steps and lays them out in self._window_ints / self._window_floats, after its draws
        (dsim.engine.compiled_step.WindowPricing, for window_steps, plan_window and commit_window)."""
        return (
            self.kv_dec,
            self.total_blocks - self.pre_blocks,
            self.lookahead,
            self._forward_table,
            float(self.cost.kv_ms_per_tok),
            fixed_ms,
            self._context_args,
            float(self.env.now),
            self._window_ints,
            self._window_floats,
        )

    def _decode_window(self) -> Generator[Any, Any, DecodeOutcome]:
        """A decode-only window of up to max_window steps, planned in one compiled call, waited
        on as one simpy wait (cut short at an arrival on this replica) and committed in one;
        returns what its committed steps produced (a general step's where even the first step
        needs a preemption)."""
        env, K, cfg = self.env, self.K, self.cfg
        n = self.n
        left_min = (
            int(self.left_lb) if self.left_lb > 0 else int((self.live_ints[:, END] - self.live_ints[:, COMP]).min())
        )
        # Steps until the first possible completion bound the window (one token a step at least;
        # the draws themselves stop at the first step where some slot may finish). A request
        # emits about 3 tokens a step at DSpark's acceptance: an adaptive window is bounded by a
        # third of it, about where the first completion lands (a longer bound measured no faster
        # on the default plan, and moves window boundaries, hence the times' last bits).
        k = min(cfg.max_window, WINDOW_SLOTS // n, left_min // 3 if self._adaptive else left_min)
        k = max(1, int(k))
        # Open loop: no draws past the next known arrival (each step takes at least the forward
        # of n tokens), where an arrival cutting the window short would waste many draws.
        dms = self._draft_ms(n)
        if k * n > CHEAP_WINDOW_SLOTS:
            t_next = self.next_arrival()
            if t_next is not None:
                floor_ms = self.cost.forward_ms(n) + dms + self.cpu_ms
                k_arr = (t_next - env.now) * 1000.0 // max(floor_ms, 1e-6) + 1
                k = int(min(k, max(k_arr, CHEAP_WINDOW_SLOTS // n, 1)))
        wi, wf = self._window_ints, self._window_floats
        fixed_ms = dms + self.cpu_ms
        comp0 = None
        pricing = self._window_pricing(fixed_ms)
        if K > 0 and self._script is None and self.shapes is None:
            # the draws and the window's shape in one compiled call (as _draft_and_verify, then
            # window_steps over the steps it planned)
            conf, lvc, args = self._plan_args(k, n, 0.0)
            lead, verified, cap = lvc[0], lvc[1], lvc[2]
            k, last, general, past = KS.plan_window(*args, pricing)
        else:
            if K > 0:
                conf, lead, verified, cap, _, k = self._draft_and_verify(k)  # (k: up to a possible completion)
            else:
                conf = None
                lead = verified = cap = self._no_steps
            comp0 = self.live_ints[:, COMP].copy() if self.shapes is not None else None
            plan = (conf if K > 0 else self._no_conf, lead, verified, cap)
            last, general, past = KS.window_steps(self._slot_ints, n, K, k, plan, pricing)
        if general:  # even one step needs a preemption: take the general path
            plan = self._plan_step()
            if not self._skip(plan.duration_ms / 1000.0):
                yield env.timeout(plan.duration_ms / 1000.0)
            return self._commit_step(plan)
        if past:  # steps past the dense table: the cost model prices them
            q = last + 1
            fwd, dur = wf[0, :q], wf[2, :q]
            fwd[:] = self.cost.step_ms(wi[0, :q], wi[2, :q])
            dur[:] = fwd + wf[1, :q] + fixed_ms
            wf[3, :q] = env.now + np.cumsum(dur) / 1000.0
            wf[4, :q] = np.maximum.accumulate(dur)
        # Run until the last step ends or an arrival wakes us; then commit the steps that ended
        # before the wake-up plus the one in flight. (The timeout triggers the wake event: one
        # event to wait on, cheaper than a condition over two.)
        t_last = float(wf[3, last])  # (a Python float: the clock stays one)
        if not self._skip(t_last - env.now):  # (no arrival can wake us before the window ends)
            self.wake = wake = env.event()
            env.timeout(t_last - env.now).callbacks.append(lambda _: None if wake.triggered else wake.succeed())
            yield wake
            if env.now < t_last - 1e-12:
                last = min(int(wf[3, : last + 1].searchsorted(env.now - 1e-12, side="left")), last)
                t_last = float(wf[3, last])
                if t_last > env.now:
                    yield env.timeout(t_last - env.now)
        m = last + 1
        if self.shapes is not None:
            cum = np.zeros(n, np.int64)
            for t in range(m):
                qv = (1 + verified[t]) if K > 0 else np.ones(n, np.int64)
                self.shapes.append(
                    (self.idx, float(wf[3, t]), qv.tolist(), (comp0 + cum).tolist(), float(wf[0, t] + wf[1, t]))
                )
                cum += (np.minimum(lead[t], cap[t]) + 1) if K > 0 else 1
        # the commit (as _commit_step's) and the window's step rows and ITL samples, one call
        self._grow_steps(m)
        v = self.itl_vals
        j = v.reserve(m)
        st = self.steps
        i = st.reserve(m)  # (before reading st.a: reserving may move it)
        vt, at, lt, et, min_left = KS.commit_window(
            self._slots,
            n,
            m,
            K,
            (conf if K > 0 else self._no_conf, lead, verified, cap),
            self._no_cut,
            float(wf[4, last]),
            self._commit_out,
            self._policy,
            (st.a, i, self.idx, len(self.waiting), wi, wf, v.a, j),  # (a WindowRows)
        )
        self._account(m, conf, lead, vt, at, lt, et, min_left)
        self.n_steps += m
        self.batch_sum += m * n  # (each of the window's steps: n requests, as window_rows writes)
        self._last_is_prev_end = True  # (prev_end = t_last below)
        self.prev_end = float(t_last)
        self._finish_done()
        return DecodeOutcome(m, n, K, self._slot_out, self._step_out, vt, at, et, lt)
