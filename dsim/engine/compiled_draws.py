"""The acceptance model's draws as compiled kernels (numba, nopython, cached on disk).

* random numbers: one counter-based SplitMix64 stream per (request, draft round); standard
  normals by the ziggurat method (Marsaglia and Tsang, "The Ziggurat Method for Generating
  Random Variables", J. Stat. Softw. 2000, 128 layers), uniforms from the top 53 bits;
* the draws (``draw_slots``): per slot and step the half logit
  g = sigma_token z / (2T) + sigma_step u / (2T) + offset, the outcome u < sigmoid(2 g T) and the
  confidence sigmoid(2 (g + (s z' - b) / (2T))), the quantities of ``dsim.spec.AcceptanceModel``
  (the definition, one request at a time: ``_position``; from LANES_MIN slots on, drawn a position
  at a time for all slots at once with the same values: ``_position_pass``).
"""

from __future__ import annotations

import decimal
import math

import numpy as np
from numba import njit, uint64

from dsim.engine.compiled_bundles import HEAD_MODEL, HEAD_USELESS, ID, ROUNDS, DrawParams, SlotDraws

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
