"""Verify-budget policies: how many of each request's K drafts to verify this step.

All policies work on a window of k consecutive steps at once (arrays [k, R, K]) and return
``int[k, R]`` windows l (the request verifies its last token plus drafts 1..l). Interface
(docs/dev/architecture.md, "Policy interface")::

    policy = make_policy(name, **opts)
    l = policy.windows(conf_now, conf_prev, conf_prev2, ctx)     # int64[k, R]

``conf_now`` are the confidences of the drafts being verified, ``conf_prev`` / ``conf_prev2`` those
of one / two steps earlier (same shapes; the engine shifts its history; None falls back to the
newer one). Postconditions: 0 <= l <= min(K, ctx.k_max); sum_r l + n_nondraft <= token_limit.

Survival scores s_{r,j} = c_{r,1} ... c_{r,j} (non-increasing in j). Ranking is always by a stable
sort of -s over the (request, position) grid in row-major order, so equal scores keep position
order inside a request and a request's chosen slots are a prefix. Drafts with s = 0 are never
chosen by the cost-aware policies (zero expected gain).

Policies (docs/user/semantics.md, verify-budget policies):

* ``fixed``: verify all K (trimmed from the tail of the queue, FCFS, only if the token limit binds).
* ``threshold`` (``tau=0.3``): verify while s_{r,j} >= tau (static confidence threshold).
* ``vllm``: vLLM 0.33 ``enable_adaptive_verification``. Budget B = global argmax over b in 0..M of
  E(b) / C(b) with the PREVIOUS step's confidences: E(b) = R_s + sum of the top-b scores,
  C(b) = draft_ms + verify_ms(N + b), N = non-draft tokens of the step, R_s = requests that sample
  (``ctx.n_sampling``, default R), M = min(total drafts, token_limit - N). The B slots then go to
  the top-B scores from the CURRENT confidences. Ties in the argmax take the smallest b.
* ``paper`` (``production=False``): DSpark Algorithm 1 on the current confidences: admit (r, j) in
  descending survival, Theta(B) = tau*(B) x SPS(B) with tau* = R + admitted scores and
  SPS = 1 / (draft_ms + verify_ms(N + b)); stop at the first admission that does not raise Theta.
  ``production=True`` (section 5.2): no early stop (global argmax), the budget is computed from
  confidences two steps old (``conf_prev2``), admission ranks by the current ones.
* ``sglang`` (``cost=AdditiveCost``): the same E/C objective on the current confidences, with an
  additive cost T(R, M) = bias + alpha(R) + theta(M), M = N + b tokens, each term a linearly
  interpolated table (``AdditiveCost.from_cost`` builds them from a CostModel). Without a table
  it uses ctx.draft_ms + ctx.verify_ms. Our reading of SGLang's scheduler; its verify modes are
  in ``verify_tokens_and_commit``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dsim.errors import InputError

__all__ = [
    "PolicyContext",
    "BudgetPolicy",
    "FixedPolicy",
    "ThresholdPolicy",
    "VllmPolicy",
    "PaperPolicy",
    "SglangPolicy",
    "AdditiveCost",
    "make_policy",
    "POLICIES",
    "VERIFY_MODES",
    "verify_tokens_and_commit",
    "survival",
]


@dataclass(frozen=True)
class PolicyContext:
    """What a policy may know about the step(s) besides the confidences.

    verify_ms: maps an int token-count array (any shape) to step ms of the target forward,
      context term included (the engine's staircase cost).
    draft_ms: draft time of the step (ms), independent of the window.
    n_nondraft: int[k] tokens in each step that are not drafts (R_s decode tokens + prefill tokens).
    token_limit: max_num_batched_tokens.
    k_max: largest window allowed (<= K).
    n_sampling: int[k] requests that sample a token this step (R_s); None = R (every decode).
    step_extra_ms: float[k] cost added to step t whatever its budget (None: nothing).
    """

    verify_ms: Callable[[np.ndarray], np.ndarray]
    draft_ms: float
    n_nondraft: np.ndarray
    token_limit: int
    k_max: int
    n_sampling: np.ndarray | None = None
    step_extra_ms: np.ndarray | None = None  # float[k] added to every budget's cost of step t


def survival(conf: np.ndarray) -> np.ndarray:
    """s[..., j] = prod_{i<=j} conf[..., i] (conf clipped to [0, 1])."""
    # np.minimum/np.maximum, not np.clip: this runs every engine step and np.clip's wrapper
    # costs more than the arithmetic on these small arrays.
    return _cumprod_inplace(np.minimum(np.maximum(conf, 0.0), 1.0), axis=-1)


def _cumprod_inplace(s: np.ndarray, axis: int) -> np.ndarray:
    """Cumulative product of ``s`` along a short ``axis``, in place (the same products in the same
    order as np.cumprod): np.cumprod runs one inner loop per row there, K - 1 multiplies over
    whole slices are several times cheaper at K <= 16."""
    axis %= s.ndim
    n = s.shape[axis]
    if n > 16:
        return np.cumprod(s, axis=axis)
    lead = (slice(None),) * axis  # basic indexing: np.moveaxis costs more than a multiply here
    for j in range(1, n):
        np.multiply(s[lead + (j - 1,)], s[lead + (j,)], out=s[lead + (j,)])
    return s


def _prep(conf, ctx: PolicyContext):
    conf = np.asarray(conf)
    if conf.ndim != 3:
        raise ValueError(f"conf must be [k, R, K], got shape {conf.shape}")
    K = min(conf.shape[2], int(ctx.k_max))
    return conf[:, :, :K]


def _n_nondraft(ctx, k):
    n = np.asarray(ctx.n_nondraft, dtype=np.int64).reshape(-1)
    if n.size == 1 and k != 1:
        n = np.full(k, int(n[0]), dtype=np.int64)
    return n


def _cap_fcfs(l: np.ndarray, n_nondraft: np.ndarray, token_limit: int) -> np.ndarray:
    """Trim windows in queue order so sum_r l + N <= limit (earlier requests keep theirs)."""
    allowed = np.maximum(int(token_limit) - n_nondraft, 0)[:, None]
    before = np.cumsum(l, axis=1) - l
    return np.clip(allowed - before, 0, l)


def _top_b_windows(S: np.ndarray, B: np.ndarray, srt: np.ndarray | None = None) -> np.ndarray:
    """Give each step's B slots to its top-B positive scores; returns int64[k, R].

    Equivalent to ranking by a stable descending sort (ties go to the earlier grid index, so a
    request's slots stay a prefix), but found through the B-th largest value: a value sort and a
    few comparisons instead of an argsort and a scatter (this runs every engine step)."""
    k, R, K = S.shape
    flat = S.reshape(k, -1)
    B = np.broadcast_to(np.asarray(B, dtype=np.int64).reshape(-1), (k,))
    if flat.shape[1] == 0:
        return np.zeros((k, R), dtype=np.int64)
    if srt is None:
        srt = -np.sort(-flat, axis=1)
    thr = srt[np.arange(k), np.clip(B - 1, 0, flat.shape[1] - 1)][:, None]
    gt = flat > thr
    ties = flat == thr
    need = (B - gt.sum(1))[:, None]
    sel = gt | (ties & (np.cumsum(ties, axis=1) <= need))
    sel &= (flat > 0) & (B > 0)[:, None]
    return sel.reshape(k, R, K).sum(-1).astype(np.int64)


def _sorted_cumsum(S: np.ndarray, srt: np.ndarray | None = None):
    """Per step: scores sorted descending and cs[b] = sum of the top-b (cs[0] = 0)."""
    k = S.shape[0]
    if srt is None:
        srt = -np.sort(-S.reshape(k, -1), axis=1)
    cs = np.concatenate([np.zeros((k, 1)), np.cumsum(srt, axis=1, dtype=np.float64)], axis=1)
    npos = (srt > 0).sum(1)
    return srt, cs, npos


def _max_budget(R: int, K: int, n_nondraft: np.ndarray, token_limit: int) -> np.ndarray:
    return np.minimum(np.maximum(int(token_limit) - n_nondraft, 0), R * K)


def _objective(S, ctx, cost_fn, n_samp, srt=None):
    """E(b) / C(b) for b = 0..R*K, per step: returns (ratio [k, RK+1], cs, npos, M)."""
    k, R, K = S.shape
    N = _n_nondraft(ctx, k)
    _, cs, npos = _sorted_cumsum(S, srt)
    b = np.arange(R * K + 1)
    tokens = N[:, None] + b[None, :]
    C = np.asarray(cost_fn(tokens.ravel()), dtype=np.float64).reshape(tokens.shape)
    if ctx.step_extra_ms is not None:  # e.g. each step's own KV-context term inside a window
        C = C + np.asarray(ctx.step_extra_ms, dtype=np.float64).reshape(-1, 1)
    E = n_samp[:, None] + cs
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = E / C
    M = _max_budget(R, K, N, ctx.token_limit)
    return ratio, cs, npos, M


def _argmax_budget(ratio, limit):
    """Global argmax over b in 0..limit (first maximum); -inf outside."""
    b = np.arange(ratio.shape[1])
    r = np.where(b[None, :] <= limit[:, None], ratio, -np.inf)
    return np.argmax(r, axis=1)


def _n_sampling(ctx, k, R):
    if ctx.n_sampling is None:
        return np.full(k, float(R))
    n = np.asarray(ctx.n_sampling, dtype=np.float64).reshape(-1)
    return np.full(k, float(n[0])) if n.size == 1 and k != 1 else n


class BudgetPolicy:
    """Base class. ``windows(conf_now, conf_prev=None, conf_prev2=None, ctx) -> int64[k, R]``."""

    name = "base"

    def windows(self, conf_now, conf_prev=None, conf_prev2=None, ctx: PolicyContext | None = None):
        raise NotImplementedError

    def _step_cost(self, ctx):
        d = float(ctx.draft_ms)
        return lambda t: d + np.asarray(ctx.verify_ms(np.asarray(t)), dtype=np.float64)


class FixedPolicy(BudgetPolicy):
    """Verify all K drafts (fixed block), FCFS-trimmed only if the token limit binds."""

    name = "fixed"

    def windows(self, conf_now, conf_prev=None, conf_prev2=None, ctx=None):
        c = _prep(conf_now, ctx)
        k, R, K = c.shape
        l = np.full((k, R), K, dtype=np.int64)
        return _cap_fcfs(l, _n_nondraft(ctx, k), ctx.token_limit)


class ThresholdPolicy(BudgetPolicy):
    """Verify while survival >= tau (default 0.3), FCFS-trimmed to the token limit."""

    name = "threshold"

    def __init__(self, tau: float = 0.3):
        if not (0.0 <= tau <= 1.0):
            raise InputError(f"policy threshold: tau must be in [0, 1], got {tau}")
        self.tau = float(tau)

    def windows(self, conf_now, conf_prev=None, conf_prev2=None, ctx=None):
        c = _prep(conf_now, ctx)
        k = c.shape[0]
        l = (survival(c) >= self.tau).sum(-1).astype(np.int64)
        return _cap_fcfs(l, _n_nondraft(ctx, k), ctx.token_limit)


class VllmPolicy(BudgetPolicy):
    """vLLM 0.33 adaptive verification (budget from the previous step's confidences)."""

    name = "vllm"

    def budget(self, conf_prev, ctx):
        """B per step (int64[k]) from ``conf_prev``: global argmax of E(b)/C(b), b in 0..M."""
        c = _prep(conf_prev, ctx)
        k, R, K = c.shape
        S = survival(c)
        ratio, cs, npos, M = _objective(S, ctx, self._step_cost(ctx), _n_sampling(ctx, k, R))
        return _argmax_budget(ratio, M)

    def windows(self, conf_now, conf_prev=None, conf_prev2=None, ctx=None):
        prev = conf_now if conf_prev is None else conf_prev
        k = np.shape(conf_now)[0]
        if k == 1 and ctx.step_extra_ms is None:
            return self._one_step(conf_now, prev, ctx)
        # One survival and one sort over [previous; current] (this runs every engine step):
        # the budget reads the first half, the allocation the second.
        S = survival(_prep(np.concatenate([prev, conf_now]), ctx))
        srt = -np.sort(-S.reshape(2 * k, -1), axis=1)
        R = S.shape[1]
        ratio, cs, npos, M = _objective(S[:k], ctx, self._step_cost(ctx), _n_sampling(ctx, k, R), srt[:k])
        B = _argmax_budget(ratio, M)
        return _top_b_windows(S[k:], B, srt[k:])

    def _one_step(self, conf_now, conf_prev, ctx):
        """``windows`` for a single step through ``one_step`` (same result as the general path)."""

        def rng_ms(n0, n1):
            return ctx.verify_ms(np.arange(n0, n1))

        return self.one_step(
            np.asarray(conf_now)[0],
            np.asarray(conf_prev)[0],
            int(_n_nondraft(ctx, 1)[0]),
            float(_n_sampling(ctx, 1, np.shape(conf_now)[1])[0]),
            float(ctx.draft_ms),
            rng_ms,
            int(ctx.token_limit),
            int(ctx.k_max),
        )[None]

    def one_step(
        self,
        now,
        prev,
        n_nondraft: int,
        n_sampling: float,
        draft_ms: float,
        verify_ms_range,
        token_limit: int,
        k_max: int,
        in_unit: bool = False,
    ) -> np.ndarray:
        """Windows int64[R] of one step from confidences ``now`` / ``prev`` [R, K] and the cost
        row ``verify_ms_range(n0, n1)`` (= verify_ms at n0..n1-1): the engine's every-step call,
        without a PolicyContext. Survivals are built position-major ([K, R] rows: contiguous for
        the engine's draws); one value sort for the budget, a partition for the allocation and,
        unless scores tie at the B-th value, one comparison. ``in_unit``: the caller guarantees
        every confidence is in [0, 1] (no clipping; the engine's sampled heads are)."""
        R = now.shape[0]
        K = min(now.shape[1], k_max)
        RK = R * K
        if RK == 0:
            return np.zeros(R, dtype=np.int64)
        f32 = now.dtype == np.float32 and prev.dtype == np.float32
        # [K, 2, R]: position j's previous and current scores side by side, so the survival
        # products run over contiguous [2, R] blocks (numpy's per-call cost dominates here).
        S = np.empty((K, 2, R), dtype=np.float32 if f32 else np.float64)
        if in_unit:  # the caller guarantees [0, 1]
            S[:, 0] = prev[:, :K].T
            S[:, 1] = now[:, :K].T
        else:
            np.maximum(prev[:, :K].T, 0.0, out=S[:, 0])
            np.maximum(now[:, :K].T, 0.0, out=S[:, 1])
            np.minimum(S, 1.0, out=S)
        for j in range(1, K):  # survivals
            np.multiply(S[j - 1], S[j], out=S[j])
        N = n_nondraft
        M = min(max(token_limit - N, 0), RK)
        # The budget's scores in descending order, as an ascending sort of their negatives (a
        # contiguous cumulative sum; negation is exact, so the partial sums are the same).
        neg = np.negative(S[:, 0]).reshape(-1)
        neg.sort()
        cs = np.zeros(M + 1)
        top = cs[1:]
        top[:] = neg[:M]  # (float64 before summing)
        top.cumsum(out=top)
        np.negative(cs, out=cs)
        C = np.asarray(verify_ms_range(N, N + M + 1), dtype=np.float64)
        if draft_ms:
            C = C + draft_ms
        cs += n_sampling
        if C[0] > 0:  # C is non-decreasing: no zero division anywhere
            cs /= C
        else:
            with np.errstate(divide="ignore", invalid="ignore"):
                cs /= C
        B = int(cs.argmax())
        if B == 0:
            return np.zeros(R, dtype=np.int64)
        cur = S[:, 1]
        flat = cur.flatten()  # (always a copy: partitioned in place)
        flat.partition(RK - B)
        thr = flat[RK - B]  # the B-th largest current score
        sel = cur > 0 if thr <= 0 else cur >= thr  # thr <= 0: fewer than B positive
        if thr > 0 and np.count_nonzero(sel) != B:  # ties at the B-th value: ranks
            return _top_b_windows(np.ascontiguousarray(cur.T)[None], np.array([B]))[0]
        return np.add.reduce(sel, axis=0, dtype=np.int64)


class PaperPolicy(BudgetPolicy):
    """DSpark Algorithm 1 (early stop) or its section 5.2 production form."""

    name = "paper"

    def __init__(self, production: bool = False):
        self.production = bool(production)

    def budget(self, conf, ctx, early_stop: bool):
        c = _prep(conf, ctx)
        k, R, K = c.shape
        S = survival(c)
        ratio, cs, npos, M = _objective(S, ctx, self._step_cost(ctx), np.full(k, float(R)))
        limit = np.minimum(M, npos)  # candidate space: a_{r,j} > 0
        if not early_stop:
            return _argmax_budget(ratio, limit)
        # Admit while Theta strictly rises: B = number of leading strict increases.
        rises = np.diff(ratio, axis=1) > 0
        b = np.arange(rises.shape[1])
        rises &= b[None, :] < limit[:, None]
        stop = np.where(rises.all(1), rises.shape[1], np.argmin(rises, axis=1))
        return np.minimum(stop, limit)

    def windows(self, conf_now, conf_prev=None, conf_prev2=None, ctx=None):
        if self.production:
            old = conf_prev2 if conf_prev2 is not None else (conf_prev if conf_prev is not None else conf_now)
            B = self.budget(old, ctx, early_stop=False)
        else:
            B = self.budget(conf_now, ctx, early_stop=True)
        return _top_b_windows(survival(_prep(conf_now, ctx)), B)


@dataclass(frozen=True)
class AdditiveCost:
    """SGLang-style additive step cost T(R, M) = bias + alpha(R) + theta(M), linear interpolation
    inside each table and the end value beyond it (np.interp)."""

    bias: float
    alpha_r: tuple
    alpha_ms: tuple
    theta_m: tuple
    theta_ms: tuple

    def __call__(self, R, M):
        return self.bias + np.interp(R, self.alpha_r, self.alpha_ms) + np.interp(M, self.theta_m, self.theta_ms)

    @classmethod
    def from_cost(
        cls, cost, method=None, max_requests: int = 1024, max_tokens: int = 8192, kv_ms_per_request: float = 0.0
    ):
        """Build the tables from a duck-typed CostModel: bias = per-step CPU overhead
        (``cost.cpu_overhead_ms`` or ``cost.profile.cpu_overhead_ms``, else 0); theta(M) =
        ``cost.forward_ms(M)`` sampled at 1..16, every 16 to 512, then doubling to max_tokens
        (linear interpolation between the samples smooths the staircase, as an additive table
        does); alpha(R) = draft time ``method.draft_ms(cost, R)`` (0 without a method) plus
        ``kv_ms_per_request x R`` (the per-request attention/context part; pass
        kv_ms_per_ktok x mean context / 1000)."""
        bias = getattr(cost, "cpu_overhead_ms", None)
        if bias is None:
            bias = getattr(getattr(cost, "profile", None), "cpu_overhead_ms", 0.0) or 0.0
        m = list(range(1, 17)) + list(range(32, 513, 16))
        x = 1024
        while x < max_tokens:
            m.append(x)
            x *= 2
        m.append(int(max_tokens))
        m = sorted(set(v for v in m if v <= max_tokens))
        theta = [float(cost.forward_ms(v)) for v in m]
        r = sorted(set([1, 2, 4, 8, 16, 32, 64, 128, 256, 512, int(max_requests)]))
        r = [v for v in r if v <= max_requests]
        alpha = [(method.draft_ms(cost, v) if method is not None else 0.0) + kv_ms_per_request * v for v in r]
        return cls(float(bias), tuple(r), tuple(alpha), tuple(m), tuple(theta))


class SglangPolicy(BudgetPolicy):
    """Same E/C objective on the current confidences, additive cost table (see AdditiveCost)."""

    name = "sglang"

    def __init__(self, cost: AdditiveCost | None = None):
        self.cost = cost

    def budget(self, conf, ctx):
        c = _prep(conf, ctx)
        k, R, K = c.shape
        S = survival(c)
        if self.cost is None:
            fn = self._step_cost(ctx)
        else:
            tab = self.cost
            fn = lambda t: tab(R, t)  # noqa: E731
        ratio, cs, npos, M = _objective(S, ctx, fn, _n_sampling(ctx, k, R))
        return _argmax_budget(ratio, np.minimum(M, npos))

    def windows(self, conf_now, conf_prev=None, conf_prev2=None, ctx=None):
        B = self.budget(conf_now, ctx)
        return _top_b_windows(survival(_prep(conf_now, ctx)), B)


POLICIES = {
    "fixed": FixedPolicy,
    "threshold": ThresholdPolicy,
    "vllm": VllmPolicy,
    "paper": PaperPolicy,
    "sglang": SglangPolicy,
}


def make_policy(name: str, **opts) -> BudgetPolicy:
    """``fixed``; ``threshold`` (tau=0.3); ``vllm``; ``paper`` (production=False);
    ``sglang`` (cost=AdditiveCost or None). Unknown options raise InputError."""
    key = str(name).strip().lower()
    if key == "paper-production":
        key, opts = "paper", {**opts, "production": True}
    if key not in POLICIES:
        raise InputError(f"policy: unknown policy {name!r} (choose from {', '.join(POLICIES)})")
    try:
        return POLICIES[key](**opts)
    except TypeError as e:
        raise InputError(f"policy {key}: {e}") from None


VERIFY_MODES = ("static", "compact", "cap-accept")


def verify_tokens_and_commit(mode: str, windows, K: int):
    """SGLang verify modes -> (drafts verified per request, commit cap per request), int64 arrays
    shaped like ``windows`` (views of it or of one full array: read-only use). The step's tokens
    for a decode are 1 + verified; the request emits accepted_prefix(accept, commit_cap) + 1 tokens.

    static: verify the full block, commit every accepted draft (window ignored);
    compact: verify only the window, commit within it (the real gain);
    cap-accept: verify the full block, commit at most the window (acceptance ceiling at full cost).
    """
    w = np.asarray(windows, dtype=np.int64)
    if mode == "compact":
        return w, w
    if mode == "static":
        full = np.full_like(w, int(K))
        return full, full
    if mode == "cap-accept":
        return np.full_like(w, int(K)), w
    raise InputError(f"verify mode: expected one of {', '.join(VERIFY_MODES)}, got {mode!r}")
