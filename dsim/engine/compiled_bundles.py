"""The engine's compiled boundary: the layouts and named bundles every compiled step kernel
(dsim.engine.compiled_draws, compiled_budget, compiled_decode, compiled_window, compiled_sched,
compiled_general_steps) reads.

* the decode slots' int table columns (``ID`` .. ``VSUM``, ``NCOL``), the step table's rows the
  kernels write (``STEP_COLUMNS``, ``SC_*``), the budget policies', verify modes' and confidence
  heads' codes (``POLICY_CODES``, ``VERIFY_CODES``, ``HEAD_CODES``);
* the named bundles (``SlotTable``, ``DrawParams``, ``PolicyParams``, ``DecodePlan``, ...): plain
  tuples at the call, named inside the kernel (docs/dev/architecture.md, "The compiled boundary").

Layouts: confidences and offsets are position-major ``[K, R]`` (a request is a column); the int
slot table is ``[capacity, NCOL]`` with the column indices below. Every kernel takes whole buffers
plus the live count, so each compiles once per process type signature (and is cached on disk).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from dsim.kernel_cache import ensure_fresh
from dsim.spec.heads import HEAD_CODES

# Decode-slot columns of the int table (SlotTable.ints, the engine's Replica._slot_ints).
ensure_fresh()  # (numba's cache does not see edits to the modules a kernel calls)

ID, COMP, END, CLS, EMITS, ROUNDS, ASUM, VSUM = range(8)
NCOL = 8
# The step table's fields (dsim.engine.StepRecord, which the engine checks against these), the
# rows of its column-major blocks that the kernels write.
STEP_COLUMNS = (
    "replica", "t_end_s", "duration_ms", "n_requests", "n_decode", "n_tokens", "prefill_tokens",
    "verify_draft_tokens", "accepted_tokens", "emitted_tokens", "kv_tokens", "n_waiting",
)  # fmt: skip
(SC_REPLICA, SC_T_END, SC_DURATION, SC_REQUESTS, SC_DECODE, SC_TOKENS, SC_PREFILL, SC_VERIFIED, SC_ACCEPTED,
 SC_EMITTED, SC_KV, SC_WAITING) = range(12)  # fmt: skip
# Policy codes.
FIXED, THRESHOLD, VLLM, PAPER, PAPER_PRODUCTION, SGLANG = range(6)
POLICY_CODES = {
    "fixed": FIXED,
    "threshold": THRESHOLD,
    "vllm": VLLM,
    "paper": PAPER,
    "paper-production": PAPER_PRODUCTION,
    "sglang": SGLANG,
}
# Verify modes (SGLang).
STATIC, COMPACT, CAP_ACCEPT = range(3)
VERIFY_CODES = {"static": STATIC, "compact": COMPACT, "cap-accept": CAP_ACCEPT}
# Confidence heads: the codes of dsim.spec.heads' registry, one constant per branch of the draws
# (tests/test_registry.py ties each kind's capabilities to the branches that test its constant).
HEAD_MODEL, HEAD_PERFECT, HEAD_USELESS = HEAD_CODES["model"], HEAD_CODES["perfect"], HEAD_CODES["useless"]


# ---- the named bundles the kernels take ---------------------------------------------------------
# A kernel takes a handful of bundles, each a NamedTuple below, instead of a long positional list.
# From Python a bundle travels as a plain tuple (``tuple(bundle)``, or ``Bundle(...)`` kept as
# ``tuple``): numba's dispatcher types a plain tuple's elements in C, as it does positional
# arguments, but a named tuple's one by one in Python (about 0.17 us a field a call, measured), and
# the engine calls these kernels once or twice a step. The kernel names the fields on entry
# (``slots = SlotTable(*slots)``, free in compiled code); a tuple of the wrong length or element
# kinds fails to compile there. Calls between kernels pass the same plain tuples on, so each
# kernel compiles once, with the types Python's calls give it.


class SlotTable(NamedTuple):
    """The decode slots (the engine's slot buffers, the first n live)."""

    ints: np.ndarray  # int64 [capacity, NCOL]: the columns ID .. VSUM above
    floats: np.ndarray  # float64 [capacity, 2]: last emission (s), largest ITL (ms)
    rows: np.ndarray  # float32 [rows, capacity]: the slot offsets, then the confidence history


class DrawParams(NamedTuple):
    """The acceptance model's draws (dsim.spec.AcceptanceModel.kernel_params, the run key first)."""

    key: int  # the run key of the counter-based streams (run_key)
    head: int  # HEAD_MODEL, HEAD_PERFECT or HEAD_USELESS
    tok_scale: float  # sigma_token / (2T)
    step_scale: float  # sigma_step / (2T)
    head_scale: float  # the head's noise scale
    head_shift: float  # the head's bias
    temp: float  # the head's temperature T


class SlotDraws(NamedTuple):
    """What draw_slots writes for `steps` steps of n slots."""

    conf: np.ndarray  # float32 [steps, K, n]: the head's confidences
    lead: np.ndarray  # int64 [steps, n]: leading accepted drafts of the full block
    accept: np.ndarray  # bool [steps, K, n]: every outcome (with ``full``; else [0, 0, 0])
    p_true: np.ndarray  # float32 [steps, K, n]: every acceptance probability (likewise)


class PolicyParams(NamedTuple):
    """The verify budget and verify mode of a replica (dsim.spec.budget, dsim.spec.runtime.SpecConfig)."""

    adaptive: bool  # verify windows chosen per step by the budget policy
    code: int  # the policy's kernel (POLICY_CODES)
    tau: float  # the threshold policy's survival threshold (0 otherwise)
    hist_row: int  # first row of the previous draft round's confidences in SlotTable.rows (-1: not kept)
    hist2_row: int  # first row of the round before it (-1: not kept)
    verify_mode: int  # VERIFY_CODES
    context_ms_per_tok: float  # a later step's budget cost per KV token emitted before it (0: fixed)


class DecodePlan(NamedTuple):
    """What plan_decodes writes for up to `steps` steps of n decode slots."""

    conf: np.ndarray  # float32 [steps, K, n]: the head's confidences
    lead: np.ndarray  # int64 [steps, n]: accepted prefix length
    verified: np.ndarray  # int64 [steps, n]: drafts verified (the window)
    cap: np.ndarray  # int64 [steps, n]: the commit cap


class BudgetRow(NamedTuple):
    """What an adaptive budget is priced on (plan_decodes; ignored without adaptive policies)."""

    row: np.ndarray  # float64: the step's cost at n_nondraft + b tokens, b = 0.. (the engine's row)
    extra_ms: float  # beside the row at every budget (the step's prefill correction)
    n_nondraft: int  # the step's tokens other than drafts
    token_limit: int  # max_num_batched_tokens


class PolicyConfidences(NamedTuple):
    """The confidences a budget policy reads ([K, R] a step, or [k, K, R] for k steps)."""

    now: np.ndarray  # the step's, being verified
    prev: np.ndarray  # one step earlier (vllm's budget)
    old: np.ndarray  # two steps earlier (paper-production's)


class PolicyBudget(NamedTuple):
    """A budget policy's cost (a step's, or per step of k: each field with a leading [k])."""

    row: np.ndarray  # float64: the step's cost of n_nondraft + b tokens, b = 0..M
    extra: float  # added to every budget
    n_samp: float  # E(b)'s sampling requests
    n_nondraft: int  # the step's tokens other than drafts
    token_limit: int  # max_num_batched_tokens


class ContextArgs(NamedTuple):
    """CostModel.context_args() packed by kind (``pack_context_args``)."""

    ints: np.ndarray  # int64 [9]: on, group .. chunk slots, the table's flag, the indexer ratio
    floats: np.ndarray  # float64 [8]: balance, the split-KV coefficients, the KV slope
    batch: np.ndarray  # the format-3 table's batch grid
    q: np.ndarray  # its query-token grid
    ctx: np.ndarray  # its context grid
    table: np.ndarray  # its step costs
    share: np.ndarray  # the forward table's attention share by step size
    step_keys: np.ndarray  # the step-wide key lists' terms


class WindowPricing(NamedTuple):
    """What prices a decode window's steps and where window_steps writes their shape."""

    kv_dec: int  # the decode slots' KV tokens at the window's start
    avail_blocks: int  # KV blocks the decode slots may hold
    lookahead: int  # 1 + K: the slots a decode allocates beyond its KV tokens
    fwd_table: np.ndarray  # CostModel.forward_table()
    kv_ms_per_tok: float
    fixed_ms: float  # drafter and CPU overhead of every step
    context: tuple  # ContextArgs
    t0_s: float  # the window's start
    wi: np.ndarray  # int64 [3, >= steps]: tokens, tokens emitted, KV tokens read, per step
    wf: np.ndarray  # float64 [5, >= steps]: forward, attention terms, duration, end, longest so far


class CommitOut(NamedTuple):
    """The decode commit's reused output buffers and the accepted-drafts histogram it adds to."""

    hist: np.ndarray  # int64: accepted drafts per step of a slot (SpecStats.accepted_hist)
    slot_out: np.ndarray  # int64 [3, >= n]: per slot tokens committed, drafts verified, accepted
    step_out: np.ndarray  # int64 [3, >= m]: per step verified, accepted, emitted


class RequestColumns(NamedTuple):
    """The request table's rows that new decode slots read and write (new_slots)."""

    prompt: np.ndarray
    output: np.ndarray
    cls: np.ndarray
    emits: np.ndarray
    itl_max: np.ndarray
    first_token: np.ndarray
    last_emit: np.ndarray
    slot_rows: np.ndarray  # float32 [requests, rows]: each request's slot offsets and kept history


class WindowRows(NamedTuple):
    """Where a decode window's step rows and ITL samples go, from its shape (window_rows)."""

    steps: np.ndarray  # float64 [fields, rows]: the step table's column-major block
    step_row: int  # its first row
    replica: int
    n_waiting: int
    wi: np.ndarray  # window_steps' rows (WindowPricing.wi, wf)
    wf: np.ndarray
    itl: np.ndarray  # float64 [2, rows]: the ITL samples' block (gap ms, count)
    itl_row: int  # its first row
