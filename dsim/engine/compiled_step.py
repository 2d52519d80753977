"""The engine step's compiled kernels (numba, nopython, cached on disk).

What runs here, over the decode slots' struct-of-arrays state (the engine's ``Replica`` buffers):

* random numbers: one counter-based SplitMix64 stream per (request, draft round); standard
  normals by the ziggurat method (Marsaglia and Tsang, "The Ziggurat Method for Generating
  Random Variables", J. Stat. Softw. 2000, 128 layers), uniforms from the top 53 bits;
* the acceptance model's draws (``draw_slots``): per slot and step the half logit
  g = sigma_token z / (2T) + sigma_step u / (2T) + offset, the outcome u < sigmoid(2 g T) and the
  confidence sigmoid(2 (g + (s z' - b) / (2T))), the quantities of ``dsim.spec.AcceptanceModel``
  (the definition, one request at a time: ``_position``; from LANES_MIN slots on, drawn a position
  at a time for all slots at once with the same values: ``_position_pass``);
* the verify-budget policies (``step_windows``: fixed, threshold, vllm, paper, paper-production,
  sglang) on one cost row per step, with the same operations in the same order as the numpy
  definitions documented in ``dsim.spec.budget`` (so the windows are identical, ties included);
* the SGLang verify modes and a decode window's budgets, each step's priced at its own KV
  context (``plan_decodes``, step by step);
* the commit of decode slots (``commit_decodes``: accepted, emitted tokens, speculative counters,
  the accepted-drafts histogram) and the order-preserving removal of finished slots.

Layouts: confidences and offsets are position-major ``[K, R]`` (a request is a column); the int
slot table is ``[capacity, NCOL]`` with the column indices below. Every kernel takes whole buffers
plus the live count, so each compiles once per process type signature (and is cached on disk).
"""

from __future__ import annotations

import decimal
import math
from typing import NamedTuple

import numpy as np
from numba import njit, uint64

from dsim.cost import context_ms_compiled
from dsim.spec.heads import HEAD_CODES

# Decode-slot columns of the int table (SlotTable.ints, the engine's Replica._slot_ints).
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

    ints: np.ndarray  # int64 [capacity, NCOL]: the columns ID .. VSUM below
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


# ---- random numbers ---------------------------------------------------------------------------
# Counter-based streams: the draws of request r's draft round i come from a SplitMix64 sequence
# (Steele, Lea and Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014) seeded
# by a hash of (run key, r, i). A request's draws therefore do not depend on how its rounds are
# batched (single steps or decode windows, which replica, who else is running): windows are
# exact, and a re-planned step (after a preemption) sees the same draws.

_GOLDEN = 0x9E3779B97F4A7C15


def run_key(seed: int, salt: int = 0) -> int:
    """The uint64 key of a run's draws (from its seed)."""
    return int(np.random.default_rng([int(seed), 0xD5, int(salt)]).integers(0, 2**63))


@njit(cache=True, inline="always")
def _mix64(z):
    z = (z ^ (z >> uint64(30))) * uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> uint64(27))) * uint64(0x94D049BB133111EB)
    return z ^ (z >> uint64(31))


@njit(cache=True, inline="always")
def stream_seed(key, rid, rnd):
    """The SplitMix64 state of request rid's draft round rnd."""
    h = _mix64(uint64(key) + uint64(rid) * uint64(_GOLDEN))
    return _mix64(h ^ (uint64(rnd) * uint64(0xD1B54A32D192ED03) + uint64(1)))


# The generators pass their state by value (state in, (state, value) out) so that compiled loops
# keep it in a register; ``next_u64``, ``uniform`` and ``normal`` are the same streams on a
# one-element state array (the statistical tests' interface).


@njit(cache=True, inline="always")
def _next_v(s):
    s = s + uint64(_GOLDEN)
    return s, _mix64(s)


@njit(cache=True, inline="always")
def _uniform_v(s):
    """float64 in [0, 1): the top 53 bits."""
    s, r = _next_v(s)
    return s, float(r >> uint64(11)) * (1.0 / 9007199254740992.0)


@njit(cache=True, inline="always")
def _uniform_open_v(s):
    """float64 in (0, 1) (for logarithms)."""
    s, r = _next_v(s)
    return s, (float(r >> uint64(11)) + 0.5) * (1.0 / 9007199254740992.0)


@njit(cache=True, inline="always")
def next_u64(s):
    s[0], r = _next_v(s[0])
    return r


@njit(cache=True, inline="always")
def uniform(s):
    """float64 in [0, 1): the top 53 bits."""
    s[0], u = _uniform_v(s[0])
    return u


def _zig_tables():
    # Marsaglia & Tsang (2000), 128 layers: r = 3.442619855899, v = 9.91256303526217e-3.
    m1 = 2147483648.0
    dn = tn = 3.442619855899
    vn = 9.91256303526217e-3
    kn = np.zeros(128)
    wn = np.zeros(128)
    fn = np.zeros(128)
    q = vn / math.exp(-0.5 * dn * dn)
    kn[0] = math.floor((dn / q) * m1)
    kn[1] = 0.0
    wn[0] = q / m1
    wn[127] = dn / m1
    fn[0] = 1.0
    fn[127] = math.exp(-0.5 * dn * dn)
    for i in range(126, 0, -1):
        dn = math.sqrt(-2.0 * math.log(vn / dn + math.exp(-0.5 * dn * dn)))
        kn[i + 1] = math.floor((dn / tn) * m1)
        tn = dn
        fn[i] = math.exp(-0.5 * dn * dn)
        wn[i] = dn / m1
    return kn, wn, fn


_KN, _WN, _FN = _zig_tables()
_ZIG_R = 3.442619855899


@njit(cache=True, inline="always")
def _zig_candidate(s):
    """The ziggurat's candidate from the next draw of state s: (state, layer iz, signed 32-bit
    value j; layer and value from disjoint bits); accepted where |j| < _KN[iz], as j * _WN[iz]."""
    s, r = _next_v(s)
    return s, np.int64(r & uint64(127)), float(np.int64(r >> uint64(32)) - 2147483648)


@njit(cache=True, inline="always")
def _normal_v(s):
    """A standard normal: the ziggurat (a rejected candidate is redrawn, as in Marsaglia and
    Tsang's nfix)."""
    while True:
        s, iz, j = _zig_candidate(s)
        if abs(j) < _KN[iz]:
            return s, j * _WN[iz]
        if iz == 0:  # the base strip's tail beyond r
            while True:
                s, u1 = _uniform_open_v(s)
                x = -math.log(u1) / _ZIG_R
                s, u2 = _uniform_open_v(s)
                y = -math.log(u2)
                if y + y >= x * x:
                    break
            return s, (_ZIG_R + x if j > 0 else -_ZIG_R - x)
        x = j * _WN[iz]
        s, u = _uniform_open_v(s)
        if _FN[iz] + u * (_FN[iz - 1] - _FN[iz]) < math.exp(-0.5 * x * x):
            return s, x


@njit(cache=True, inline="always")
def normal(s):
    """A standard normal (``_normal_v``) from the one-element state array s."""
    s[0], x = _normal_v(s[0])
    return x


@njit(cache=True)
def fill_normal(key, out):
    s = np.empty(1, np.uint64)
    s[0] = stream_seed(key, 0, 0)
    for i in range(out.shape[0]):
        out[i] = normal(s)


@njit(cache=True)
def fill_uniform(key, out):
    s = np.empty(1, np.uint64)
    s[0] = stream_seed(key, 0, 0)
    for i in range(out.shape[0]):
        out[i] = uniform(s)


# ---- the acceptance model's draws -------------------------------------------------------------
# The sigmoids of a draw decide an outcome (u < sigmoid(x)) and give a float32 confidence. Both are
# computed without libm's exp where a cheaper bound settles them, and with the defining
# expression where it does not, so the results are the defining expression's, bit for bit:
# * an outcome: sigmoid is increasing, so sigmoid at the edges of x's bin of a fine grid brackets
#   it; u below the lower edge (less a margin covering the grid values' and the bin index's
#   rounding) accepts, u at or above the upper edge rejects, and only a u inside the bracket
#   (about sigmoid'(x) / 64 of the draws, at most 0.4 %) evaluates the definition;
# * the confidences, once a step's draws are made, in one pass that the compiler vectorizes (no
#   call, no branch, numpy's error model: no division check): exp from a 64-entry table of
#   2^(i/64) and a quintic (relative error below 4e-16), the float32 rounding taken where the
#   value moved by the error bound either way rounds alike; an element where it does not (about
#   3e-7 of them) or outside |x| < 120 is evaluated by the definition in a second pass.
_SIG_BINS = 64  # grid bins per unit of x
_SIG_HALF = 16.0  # the grid spans [-16, 16)
_SIG_MARGIN = 1e-12  # absolute: the grid values' and the bin index's rounding, the definition's


def _sigmoid_edges():
    n = int(2 * _SIG_HALF * _SIG_BINS)
    x = -_SIG_HALF + np.arange(n + 1) / _SIG_BINS
    return 1.0 / (1.0 + np.exp(-x))


_SIG_EDGES = _sigmoid_edges()
_EXP_TAB = 2.0 ** (np.arange(64) / 64.0)
_EXP_SCALE = np.array([math.ldexp(1.0, m) for m in range(-200, 201)])  # 2^m, m = -200..200
_EXP_INV_STEP = 64.0 / math.log(2.0)
# ln 2 / 64 as hi + lo (Cody and Waite): hi has few significant bits, so k x hi is exact; lo is
# the rest of the exact value (40 digits), not of its float64 rounding, whose error k would
# multiply.
_EXP_STEP_HI = float(np.float32(math.log(2.0) / 64.0))
with decimal.localcontext() as _ctx:
    _ctx.prec = 40
    _EXP_STEP_LO = float(decimal.Decimal(2).ln() / 64 - decimal.Decimal(_EXP_STEP_HI))
_EXP_REL = 1e-14  # bound on the table exp's relative error (below 4e-16 for |x| <= 120), with margin
_EXP_X_MAX = 120.0


@njit(cache=True, inline="always")
def _accept_bracket(u, xa):
    """(u below the lower edge of sigmoid(-xa)'s grid bin, the bracket decides): with the second
    true, the first is u < 1 / (1 + exp(xa)), the definition's outcome (see above). No branch: the
    lane-parallel pass vectorizes it."""
    f = (_SIG_HALF - xa) * _SIG_BINS
    inr = (f >= 0.0) & (f < 2.0 * _SIG_HALF * _SIG_BINS)
    i = np.int64(f if inr else 0.0)
    acc = u < _SIG_EDGES[i] - _SIG_MARGIN
    return acc, inr & (acc | (u >= _SIG_EDGES[i + 1] + _SIG_MARGIN))


@njit(cache=True, inline="always")
def _accept(u, g, temp):
    """u < 1 / (1 + exp(-2 g temp)), the definition's outcome exactly (see above)."""
    xa = -2.0 * g * temp
    acc, sure = _accept_bracket(u, xa)
    return acc if sure else u < 1.0 / (1.0 + math.exp(xa))


@njit(cache=True, inline="always")
def _confidence_bounds(y):
    """float32 roundings of 1 / (1 + exp(-2 y)) less and more the table exp's error bound
    (equal: the definition's float32 value); |2y| clamped at _EXP_X_MAX (then unequal, as for
    a NaN)."""
    x0 = -2.0 * y
    x = min(max(x0, -_EXP_X_MAX), _EXP_X_MAX)
    x = x if x == x else 0.0  # (a NaN indexes no table; it is unsure and takes the definition)
    kf = math.floor(x * _EXP_INV_STEP + 0.5)
    k = np.int64(kf)
    r = (x - kf * _EXP_STEP_HI) - kf * _EXP_STEP_LO
    q = 1.0 + r * (1.0 + r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0)))))
    c = 1.0 / (1.0 + _EXP_TAB[k & 63] * _EXP_SCALE[(k >> 6) + 200] * q)
    lo = np.float32(c * (1.0 - _EXP_REL))
    hi = np.float32(c * (1.0 + _EXP_REL)) if x == x0 else np.float32(-1.0)
    return lo, hi


@njit(cache=True, error_model="numpy")
def _confidences(Y, conf, K, n):
    """conf[j, r] = float32(1 / (1 + exp(-2 Y[j, r]))) for j < K, r < n, bit for bit the
    definition's (see above)."""
    unsure = 0
    for j in range(K):
        for r in range(n):
            lo, hi = _confidence_bounds(Y[j, r])
            conf[j, r] = lo
            unsure += lo != hi
    # (the definition element by element, stopping after the last unsure one: a loop with an
    # exit is never vectorized, so its exp is libm's, never a vector library's)
    for j in range(K if unsure else 0):
        for r in range(n):
            lo, hi = _confidence_bounds(Y[j, r])
            if lo != hi:
                conf[j, r] = 1.0 / (1.0 + math.exp(-2.0 * Y[j, r]))
                unsure -= 1
                if unsure == 0:
                    return


@njit(cache=True)
def draw_slots(draws, slot_ints, offsets, n, K, steps, full, out):
    """``steps`` steps of draws (draws: a DrawParams) for the first n slots whose offsets are
    offsets[0:K, :n] (the class curve's confidences in offsets[K:2K] for the useless head); slot r
    is request slot_ints[r, ID] at draft round slot_ints[r, ROUNDS] + t in step t. Writes (out: a
    SlotDraws) conf[t, j, r] (float32) and lead[t, r] (leading accepted drafts of the full block);
    with ``full`` also every position's outcome accept[t, j, r] and p_true[t, j, r] (else an
    outcome is drawn only while the prefix holds: later ones are never observed)."""
    params = DrawParams(*draws)
    Y = _half_logits(K, n, params.head)
    for t in range(steps):
        _draw_step(params, slot_ints, offsets, n, K, t, full, out, Y)


LANES_MIN = 32  # requests from which a step's draws run position by position for all at once


@njit(cache=True, inline="always")
def _half_logits(K, n, head):
    """The draws' scratch Y for n requests (``_draw_step``): none where nothing reads it (the
    useless head drawn request by request)."""
    return np.empty((K if head != HEAD_USELESS or n >= LANES_MIN else 0, n))


@njit(cache=True, inline="always")
def _position(s, alive, off, su, params, full):
    """One request's draws at one draft position (params: a DrawParams), in its stream's order
    (the definition the lane-parallel pass reproduces): the token normal, the head's normal
    (model head), the outcome's uniform while the prefix holds (every position with ``full``).
    Returns (state, outcome, the head's half logit y (g for the perfect head), p_true (``full``,
    else -1)); the useless head draws nothing once the prefix has failed (unless ``full``)."""
    head, tok_scale, head_scale, head_shift, temp = (
        params.head, params.tok_scale, params.head_scale, params.head_shift, params.temp
    )  # fmt: skip
    if head == HEAD_USELESS and not alive and not full:
        return s, False, 0.0, -1.0
    s, z = _normal_v(s)
    g = tok_scale * z + su + off
    y = g
    if head == HEAD_MODEL:
        s, z2 = _normal_v(s)
        y = g + (head_scale * z2 - head_shift)
    a = False
    p = -1.0
    if alive or full:
        s, u = _uniform_v(s)
        if full:
            p = 1.0 / (1.0 + math.exp(-2.0 * g * temp))
            a = u < p
        else:
            a = _accept(u, g, temp)
    return s, a, y, p


@njit(cache=True, inline="always")
def _zig_fast(s):
    """The ziggurat's first candidate from state s: (state, value, accepted); not accepted, the
    normal is ``_normal_v(s)``'s from the same s (which redraws)."""
    s, iz, j = _zig_candidate(s)
    return s, j * _WN[iz], abs(j) < _KN[iz]


@njit(cache=True, error_model="numpy")
def _step_normal_pass(S, S0, SU, step_scale, redo, n):
    """Each lane's step normal (times step_scale) from its state S[r]: the ziggurat's first
    candidate for all lanes in one vectorized pass; a lane it rejects flagged in redo (its state
    before kept in S0) and drawn by the definition."""
    nredo = 0
    for r in range(n):
        s0 = S[r]
        S0[r] = s0
        s, z, ok = _zig_fast(s0)
        S[r] = s
        SU[r] = step_scale * z
        redo[r] = not ok
        nredo += not ok
    for r in range(n if nredo else 0):
        if redo[r]:
            S[r], z = _normal_v(S0[r])
            SU[r] = step_scale * z


@njit(cache=True, error_model="numpy")
def _position_pass(S, S0, SU, X, j, params, alive, A0, redo, Y, n):
    """Position j's draws for every lane at once (``_position`` without ``full``; params: a
    DrawParams), vectorized: the ziggurat's first candidates and the outcome's bracket
    (``_accept``) for all lanes; a lane where a candidate is rejected or the bracket cannot decide
    is flagged in redo (its state and prefix before the position kept in S0, A0) for
    ``_position``. Returns the flagged count."""
    head, tok_scale, head_scale, head_shift, temp = (
        params.head, params.tok_scale, params.head_scale, params.head_shift, params.temp
    )  # fmt: skip
    model = head == HEAD_MODEL
    useless = head == HEAD_USELESS
    nredo = 0
    for r in range(n):
        al = alive[r]
        s0 = S[r]
        S0[r] = s0
        A0[r] = al
        draws = al | (not useless)
        s1, z1, ok1 = _zig_fast(s0)
        s2, z2, ok2 = _zig_fast(s1)
        g = tok_scale * z1 + SU[r] + X[j, r]
        Y[j, r] = g + (head_scale * z2 - head_shift) if model else g
        sh = s2 if model else s1  # (the state after the head's draws)
        ok2 = ok2 | (not model)
        s3 = sh + uint64(_GOLDEN)
        u = float(_mix64(s3) >> uint64(11)) * (1.0 / 9007199254740992.0)
        acc, sure = _accept_bracket(u, -2.0 * g * temp)
        S[r] = (s3 if al else sh) if draws else s0
        alive[r] = al & acc
        rd = draws & ((not ok1) | (not ok2) | (al & (not sure)))
        redo[r] = rd
        nredo += rd
    return nredo


@njit(cache=True, inline="always")
def _draw_step(params, I, X, n, K, t, full, out, Y):
    """Step t of ``draw_slots`` (params: a DrawParams; out: a SlotDraws): the outcomes and the
    head's half logits in Y [>=K, >=n] (float64
    scratch), then the confidences in one pass (``_confidences``). Without ``full``, position by
    position for all requests at once (``_position_pass``, each request's stream drawn in the
    same order as ``_position`` draws it, so the values are the same); with it, or below
    LANES_MIN requests (where the passes' set-up costs more than they save), ``_position``
    request by request."""
    key, head, step_scale = params.key, params.head, params.step_scale
    out = SlotDraws(*out)
    conf, lead, accept, p_true = out.conf, out.lead, out.accept, out.p_true
    if full or n < LANES_MIN:
        for r in range(n):
            s = stream_seed(key, I[r, ID], I[r, ROUNDS] + t)
            su = 0.0
            if step_scale != 0.0:
                s, z = _normal_v(s)
                su = step_scale * z
            alive = True
            nacc = 0
            for j in range(K):
                s, a, y, p = _position(s, alive, X[j, r], su, params, full)
                if head != HEAD_USELESS:
                    Y[j, r] = y
                if full:
                    accept[t, j, r] = a
                    p_true[t, j, r] = p
                if alive:
                    if a:
                        nacc += 1
                    else:
                        alive = False
            lead[t, r] = nacc
    else:
        S = np.empty((2, n), np.uint64)  # the lanes' states, and before the position
        SU = np.zeros(n)
        B = np.ones((3, n), np.bool_)  # the prefix holds, and before the position; redo
        for r in range(n):
            S[0, r] = stream_seed(key, I[r, ID], I[r, ROUNDS] + t)
            lead[t, r] = 0
        if step_scale != 0.0:
            _step_normal_pass(S[0], S[1], SU, step_scale, B[2], n)
        for j in range(K):
            if _position_pass(S[0], S[1], SU, X, j, params, B[0], B[1], B[2], Y, n):
                for r in range(n):
                    if B[2, r]:
                        s, a, y, _ = _position(S[1, r], B[1, r], X[j, r], SU[r], params, False)
                        S[0, r] = s
                        B[0, r] = B[1, r] & a
                        Y[j, r] = y
            for r in range(n):
                lead[t, r] += B[0, r]
    if head == HEAD_USELESS:
        for j in range(K):
            for r in range(n):
                conf[t, j, r] = X[K + j, r]
    else:
        _confidences(Y, conf[t], K, n)


# ---- verify-budget policies -------------------------------------------------------------------


@njit(cache=True, inline="always")
def _radix_scatter(a, b, cnt, sh, mask, n):
    """One LSD pass: cnt (the digit histogram of a[:n]) turned into start offsets, then a[:n]
    scattered stably into b by digit (a >> sh) & mask."""
    tot = 0
    for d in range(cnt.shape[0]):
        c = cnt[d]
        cnt[d] = tot
        tot += c
    for i in range(n):
        x = a[i]
        d = (x >> sh) & mask
        b[cnt[d]] = x
        cnt[d] += 1


@njit(cache=True)
def _sort_desc(v, out):
    """out = v sorted descending (float32, non-negative finite values; equal values are
    indistinguishable, so every method below gives the same array). Up to 48 values an
    insertion sort, below 192 numba's np.sort (the radix passes' histograms cost more than the
    values there); above, LSD radix sort on the bit patterns (non-negative floats order as
    their bits): four 8-bit passes, from 512 values on three 11-bit passes with the three digit
    histograms counted in one read. A pass whose digit is the same for every value is skipped."""
    n = v.shape[0]
    if n <= 48:
        for i in range(n):
            x = v[i]
            j = i
            while j > 0 and out[j - 1] < x:
                out[j] = out[j - 1]
                j -= 1
            out[j] = x
        return
    if n < 192:
        tmp = np.sort(v)
        for i in range(n):
            out[i] = tmp[n - 1 - i]
        return
    a = v.view(np.uint32).copy()
    b = np.empty_like(a)
    if n >= 512:
        cnt3 = np.zeros((3, 2048), np.int64)
        for i in range(n):
            x = a[i]
            cnt3[0, x & np.uint32(2047)] += 1
            cnt3[1, (x >> np.uint32(11)) & np.uint32(2047)] += 1
            cnt3[2, x >> np.uint32(22)] += 1
        for p in range(3):
            sh = np.uint32(11 * p)
            cnt = cnt3[p]
            if cnt[(a[0] >> sh) & np.uint32(2047)] == n:
                continue
            _radix_scatter(a, b, cnt, sh, np.uint32(2047), n)
            a, b = b, a
    else:
        cnt = np.zeros(256, np.int64)
        for p in range(4):
            sh = np.uint32(8 * p)
            cnt[:] = 0
            for i in range(n):
                cnt[(a[i] >> sh) & np.uint32(255)] += 1
            if cnt[(a[0] >> sh) & np.uint32(255)] == n:
                continue
            _radix_scatter(a, b, cnt, sh, np.uint32(255), n)
            a, b = b, a
    fa = a.view(np.float32)
    for i in range(n):
        out[i] = fa[n - 1 - i]


@njit(cache=True)
def _kth_largest(v, k):
    """The value at index k (0-based) of v sorted descending, without sorting: the same value a
    full sort puts there. For the policies' scores (non-negative finite float32, which order as
    their bit patterns) a radix selection: the top 10 bits' histogram picks the digit holding
    rank k, then bits 11-21 and 0-10 of the values with that prefix, a small remainder sorted
    (branch-free counting passes: a quickselect's data-dependent partition branches mispredict
    on random scores, about 2.5x slower at 1,792 scores). Other input: the quickselect."""
    n = v.shape[0]
    if n <= 64:
        return _kth_quickselect(v, k)
    a = v.view(np.uint32)
    cnt = np.zeros(2048, np.int64)
    top = 0
    for i in range(n):
        d = np.int64(a[i] >> np.uint32(22))
        cnt[d] += 1
        if d > top:
            top = d
    if top >= 510:  # from 0x7F800000 on: an infinity, a NaN or a negative value (-0.0 too)
        return _kth_quickselect(v, k)
    d = top
    while cnt[d] <= k:  # (descending: ranks from the largest digit down)
        k -= cnt[d]
        d -= 1
    m = cnt[d]
    b = np.empty(m, np.uint32)
    j = 0
    for i in range(n):
        x = a[i]
        if np.int64(x >> np.uint32(22)) == d:
            b[j] = x
            j += 1
    for sh in (11, 0):
        if m <= 32:
            break
        s = np.uint32(sh)
        cnt[:] = 0
        top = 0
        for i in range(m):
            d = np.int64((b[i] >> s) & np.uint32(2047))
            cnt[d] += 1
            if d > top:
                top = d
        d = top
        while cnt[d] <= k:
            k -= cnt[d]
            d -= 1
        if cnt[d] == m:  # every value left has this digit
            continue
        j = 0
        for i in range(m):
            x = b[i]
            if np.int64((x >> s) & np.uint32(2047)) == d:
                b[j] = x
                j += 1
        m = j
    c = b[:m].copy()
    c.sort()  # ascending bit patterns = ascending values
    return c.view(np.float32)[m - 1 - k]


@njit(cache=True)
def _kth_quickselect(v, k):
    """``_kth_largest`` by quickselect on a copy (median-of-three pivots, three-way partition)."""
    a = v.copy()
    lo = 0
    hi = a.shape[0] - 1
    while True:
        if hi - lo < 16:
            sub = np.sort(a[lo : hi + 1])  # ascending
            return sub[hi - k]
        mid = (lo + hi) // 2
        x, y, z = a[lo], a[mid], a[hi]
        if x < y:
            x, y = y, x
        if y < z:
            y, z = z, y
            if x < y:
                x, y = y, x
        piv = y  # the median of the three
        # descending three-way partition: [lo, lt) > piv, [lt, gt] == piv, (gt, hi] < piv
        lt = lo
        gt = hi
        i = lo
        while i <= gt:
            e = a[i]
            if e > piv:
                a[i] = a[lt]
                a[lt] = e
                lt += 1
                i += 1
            elif e < piv:
                a[i] = a[gt]
                a[gt] = e
                gt -= 1
            else:
                i += 1
        if k < lt:
            hi = lt - 1
        elif k > gt:
            lo = gt + 1
        else:
            return piv


@njit(cache=True)
def _ratio_argmax(srt, RK, n_samp, row, extra, limit):
    """argmax over b in 0..limit of (n_samp + top-b sum) / (row[b] + extra), the first maximum
    (a NaN counts as the maximum, as np.argmax does)."""
    cs = 0.0
    best = -np.inf
    bi = 0
    for b in range(limit + 1):
        if b > 0:
            cs += np.float64(srt[b - 1])
        r = (n_samp + cs) / (row[b] + extra)
        if np.isnan(r):
            return b
        if r > best:
            best = r
            bi = b
    return bi


# From this many scores on, the vllm / paper-production budget reads them in any order
# (``_ratio_argmax_any``); below, the sorted scores (one sort, whose order also gives the top-B
# threshold), where the digit tables would cost more than the sort.
GROUPED_MIN = 768


@njit(cache=True)
def _sort_small(g):
    """g (uint32) sorted ascending in place: insertion sort up to 32 values, else numba's sort."""
    c = g.shape[0]
    if c > 32:
        g.sort()
        return
    for i in range(1, c):
        x = g[i]
        j = i
        while j > 0 and g[j - 1] > x:
            g[j] = g[j - 1]
            j -= 1
        g[j] = x


@njit(cache=True)
def _ratio_argmax_any(v, n_samp, row, extra, limit):
    """``_ratio_argmax`` of v sorted descending, from v in any order, sorting only the values
    near the maximum. Where the denominators row[b] + extra (b <= limit) are finite, positive
    and non-decreasing and the values lie in [0, 1]: a float32 value of exponent e is a multiple
    of 2^(e - 150), so the sums of values from exponent e_min = ceil(log2 len(v)) - 30 + 127 on
    are exact in float64 in any order (below 2^ceil(log2 len(v)), 53 bits); the top-b sum at
    each boundary of the 11-bit digit groups (exponent, three mantissa bits) is therefore the
    sorted loop's value, and so is the ratio there. A group whose bound (n_samp + the sum at its
    end) / (its first denominator) is below the best boundary ratio holds no maximum (rounding
    is monotone) and is skipped; the others are sorted and scanned in order, as the loop does,
    first maximum kept. The values below e_min (and zeros) come last, sorted, summed in order.
    Otherwise (and below GROUPED_MIN scores) the full sort and ``_ratio_argmax``."""
    N = v.shape[0]
    ok = N >= GROUPED_MIN and limit >= 64 and N < (1 << 24) and abs(n_samp) < np.inf
    if ok:
        # (counted without a branch or a carried value: the loop vectorises)
        nbad = 0
        for b in range(1, limit + 1):
            nbad += not (row[b] + extra >= row[b - 1] + extra)
        ok = nbad == 0 and row[0] + extra > 0 and row[limit] + extra < np.inf
    if not ok:
        srt = np.empty(N, np.float32)
        _sort_desc(v, srt)
        return _ratio_argmax(srt, N, n_samp, row, extra, limit)
    L = 0
    while (1 << L) < N:
        L += 1
    d_min = (L - 30 + 127) << 3  # the first digit of exponent e_min
    if d_min < 1:
        d_min = 1
    # Digits d_min..1016 have bins 1..1017 - d_min; bin 0 holds every value below (the tail,
    # sorted and walked as one group): only the bins in use are cleared and walked.
    nb = 1018 - d_min
    cnt = np.zeros(nb, np.int64)
    sums = np.zeros(nb, np.float64)
    a = v.view(np.uint32)
    for i in range(N):
        x = a[i]
        if x > np.uint32(0x3F800000):  # above 1.0, negative (-0.0 too) or NaN
            ok = False
            break
        d = np.int64(x >> np.uint32(20)) - d_min + 1
        if d < 0:
            d = 0
        cnt[d] += 1
        sums[d] += np.float64(v[i])
    if not ok:
        srt = np.empty(N, np.float32)
        _sort_desc(v, srt)
        return _ratio_argmax(srt, N, n_samp, row, extra, limit)
    # the best ratio at the groups' boundaries (exact top-b sums)
    best = n_samp / (row[0] + extra)
    cs = 0.0
    b = 0
    for d in range(nb - 1, 0, -1):
        c = cnt[d]
        if c == 0:
            continue
        b += c
        if b > limit:
            break
        cs += sums[d]
        r = (n_samp + cs) / (row[b] + extra)
        if r > best:
            best = r
    # the groups that may hold the maximum, gathered by bin (a counting sort's scatter)
    take = np.zeros(nb, np.bool_)
    start = np.zeros(nb, np.int64)
    cs = 0.0
    b = 0
    for d in range(nb - 1, 0, -1):
        c = cnt[d]
        if c == 0:
            continue
        if b >= limit:
            break
        end_cs = cs + sums[d]
        if not (n_samp + end_cs) / (row[b] + extra) < best:
            take[d] = True
        cs = end_cs
        b += c
    tail = cnt[0] if b < limit else 0
    take[0] = tail > 0
    pos = 0
    for d in range(nb - 1, -1, -1):
        if take[d]:
            start[d] = pos
            pos += cnt[d]
    buf = np.empty(pos, np.uint32)
    fill = start.copy()
    for i in range(N):
        x = a[i]
        d = np.int64(x >> np.uint32(20)) - d_min + 1
        if d < 0:
            d = 0
        if take[d]:
            buf[fill[d]] = x
            fill[d] += 1
    # the scan: skipped groups advance b and the (exact) sum; taken ones are sorted and walked
    bi = 0
    bestv = n_samp / (row[0] + extra)
    cs = 0.0
    b = 0
    for d in range(nb - 1, -1, -1):
        c = cnt[d]
        if c == 0:
            continue
        if b >= limit:
            return bi
        if not take[d]:
            cs += sums[d]
            b += c
            continue
        g = buf[start[d] : start[d] + c]
        _sort_small(g)  # ascending bit patterns = ascending values
        gf = g.view(np.float32)
        for q in range(c - 1, -1, -1):
            b += 1
            if b > limit:
                return bi
            cs += np.float64(gf[q])
            r = (n_samp + cs) / (row[b] + extra)
            if r > bestv:
                bestv = r
                bi = b
    return bi


@njit(cache=True)
def _early_stop(srt, n_samp, row, extra, limit):
    """DSpark Algorithm 1: B = the number of leading strict rises of Theta(b), at most limit."""
    cs = np.float64(srt[0]) if limit > 0 else 0.0
    prev = n_samp / (row[0] + extra)
    for b in range(limit):
        cur = (n_samp + cs) / (row[b + 1] + extra)
        if not (cur - prev > 0):
            return b
        prev = cur
        if b + 1 < limit:
            cs += np.float64(srt[b + 1])
    return limit


@njit(cache=True)
def _top_b(flat, srt, B, K, R, out):
    """The B slots to the top-B positive scores (stable: ties to the earlier request-major index,
    so a request's slots are a prefix); out[r] = slots of request r. ``srt``: flat sorted
    descending, or an empty array (then the B-th largest score is selected from flat)."""
    RK = K * R
    for r in range(R):
        out[r] = 0
    if B <= 0 or RK == 0:
        return
    bb = B - 1 if B - 1 < RK - 1 else RK - 1
    thr = srt[bb] if srt.shape[0] == RK else _kth_largest(flat, bb)
    ngt = 0
    for i in range(RK):
        if flat[i] > thr:
            ngt += 1
    need = B - ngt
    ties = 0
    for r in range(R):  # (i = r K + j in order, without a division per score)
        c = 0
        for j in range(K):
            v = flat[r * K + j]
            if v > thr:
                sel = True
            elif v == thr:
                ties += 1
                sel = ties <= need
            else:
                sel = False
            if sel and v > 0:
                c += 1
        out[r] = c


@njit(cache=True)
def _cap_fcfs(out, R, allowed):
    before = 0
    for r in range(R):
        l = out[r]
        v = allowed - before
        if v < 0:
            v = 0
        if v > l:
            v = l
        out[r] = v
        before += l


@njit(cache=True, inline="always")
def _scores(c, K, R, flat, srt):
    """The request-major survival scores of confidences c [>=K, R] (flat) and, where srt is
    not empty, the same sorted descending: S[j, r] = prod_{i<=j} clip(c[i, r], 0, 1) in float32 (the
    reference's order; +0.0 for non-positive values, a clipped -0.0 sorting with the zeros) at
    flat[r * K + j]."""
    for r in range(R):
        acc = np.float32(1.0)
        for j in range(K):
            x = c[j, r]
            if not x > 0:
                x = np.float32(0.0)
            elif x > 1:
                x = np.float32(1.0)
            if j == 0:
                acc = np.float32(x)
            else:
                acc = np.float32(acc * x)
            flat[r * K + j] = acc
    if srt.shape[0] == flat.shape[0]:
        _sort_desc(flat, srt)


@njit(cache=True)
def _windows_scored(code, tau, flat, srt, src, budget, K, R, out):
    """One step's verify windows (budget: a PolicyBudget of one step) from the scores already
    computed: ``flat`` (request-major
    survival of the confidences being verified), ``srt`` (flat sorted descending; may be empty
    for vllm and paper-production, which only need its B-th largest value) and ``src`` (the
    survival of the confidences vllm / paper-production budget from: from GROUPED_MIN scores on
    in any order, their budget being a function of the values only (``_ratio_argmax_any``),
    below sorted descending). K: positions in use (min(K, k_max))."""
    budget = PolicyBudget(*budget)
    row, extra, n_samp, n_nondraft, token_limit = (
        budget.row, budget.extra, budget.n_samp, budget.n_nondraft, budget.token_limit
    )  # fmt: skip
    RK = R * K
    allowed = token_limit - n_nondraft
    if allowed < 0:
        allowed = 0
    M = allowed if allowed < RK else RK
    if code == FIXED or code == THRESHOLD:
        if code == FIXED:
            for r in range(R):
                out[r] = K
        else:
            t32 = np.float32(tau)
            for r in range(R):
                c = 0
                for j in range(K):
                    if flat[r * K + j] >= t32:
                        c += 1
                out[r] = c
        _cap_fcfs(out, R, allowed)
        return
    if code == VLLM or code == PAPER_PRODUCTION:
        lim = M
        if code == PAPER_PRODUCTION:
            npos = 0
            for i in range(RK):
                if src[i] > 0:
                    npos += 1
            lim = M if M < npos else npos
        if RK >= GROUPED_MIN:
            B = _ratio_argmax_any(src, n_samp, row, extra, lim)
        else:
            B = _ratio_argmax(src, RK, n_samp, row, extra, lim)
        _top_b(flat, srt, B, K, R, out)
        return
    npos = 0
    for i in range(RK):
        if srt[i] > 0:
            npos += 1
    limit = M if M < npos else npos
    if code == PAPER:
        B = _early_stop(srt, n_samp, row, extra, limit)
    else:  # SGLANG
        B = _ratio_argmax(srt, RK, n_samp, row, extra, limit)
    _top_b(flat, srt, B, K, R, out)


@njit(cache=True)
def step_windows(code, tau, confs, budget, k_max, out):
    """One step's verify windows (out int64[R]) from confidences [K, R] (confs: a
    PolicyConfidences): ``now`` (being verified), ``prev`` (one step earlier: vllm's budget) and
    ``old`` (two steps earlier: paper-production's). budget (a PolicyBudget): ``row[b]``, the
    step's cost of n_nondraft + b tokens for b = 0..M (M = min(max(token_limit - n_nondraft, 0),
    R x K)), ``extra`` added to every budget; ``n_samp``: E(b)'s sampling requests.
    Postconditions: 0 <= out <= min(K, k_max); sum(out) + n_nondraft <= token_limit."""
    confs = PolicyConfidences(*confs)
    now, prev, old = confs.now, confs.prev, confs.old
    Kfull, R = now.shape
    K = Kfull if Kfull < k_max else k_max
    if K < 0:
        K = 0
    RK = R * K
    flat = np.empty(RK, np.float32)
    none = np.empty(0, np.float32)
    if code == FIXED:
        _windows_scored(code, tau, flat, none, none, budget, K, R, out)
        return
    if code == THRESHOLD:
        _scores(now, K, R, flat, none)
        _windows_scored(code, tau, flat, none, none, budget, K, R, out)
        return
    if code == VLLM or code == PAPER_PRODUCTION:
        src_flat = np.empty(RK, np.float32)
        src_srt = np.empty(RK if RK < GROUPED_MIN else 0, np.float32)  # (sorted: see _windows_scored)
        _scores(prev if code == VLLM else old, K, R, src_flat, src_srt)
        _scores(now, K, R, flat, none)  # (top-B by selection: no sort)
        src = src_flat if RK >= GROUPED_MIN else src_srt
        _windows_scored(code, tau, flat, none, src, budget, K, R, out)
        return
    srt = np.empty(RK, np.float32)
    _scores(now, K, R, flat, srt)
    _windows_scored(code, tau, flat, srt, none, budget, K, R, out)


@njit(cache=True)
def policy_windows(code, tau, confs, budget, k_max, out):
    """``step_windows`` for k steps: confs (a PolicyConfidences) now / prev / old [k, K, R];
    budget (a PolicyBudget) rows [k or 1, L], extra, n_samp, n_nondraft [k]; out int64[k, R]."""
    confs, budget = PolicyConfidences(*confs), PolicyBudget(*budget)
    now, prev, old, rows = confs.now, confs.prev, confs.old, budget.row
    k = now.shape[0]
    for t in range(k):
        rt = t if rows.shape[0] > 1 else 0
        step = (rows[rt], budget.extra[t], budget.n_samp[t], budget.n_nondraft[t], budget.token_limit)
        step_windows(code, tau, (now[t], prev[t], old[t]), step, k_max, out[t])


@njit(cache=True, inline="always")
def verify_commit(mode, w, K):
    """SGLang verify modes: (drafts verified, commit cap) of a window w."""
    if mode == COMPACT:
        return w, w
    if mode == STATIC:
        return K, K
    return K, w  # CAP_ACCEPT


# ---- decode windows: budgets priced at each step's own KV context -----------------------------
# A window's step t prices its budgets at the KV context its earlier steps emitted, which depends
# on their windows: step t's windows are a function of steps 0..t-1 only, so solving the steps in
# order (plan_decodes) gives each step its exact context with one policy solve a step.


# ---- commit -----------------------------------------------------------------------------------


@njit(cache=True)
def verify_arrays(mode, win, K, verified, cap):
    """verify_commit over an int64 array (any shape flattened alike)."""
    w = win.ravel()
    v = verified.ravel()
    c = cap.ravel()
    for i in range(w.shape[0]):
        v[i], c[i] = verify_commit(mode, w[i], K)


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


# ---- one step (or window) of the decode slots: draws, verify windows, verify modes ------------


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
