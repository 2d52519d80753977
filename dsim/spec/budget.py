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

Policies (docs/user/semantics.md §4):

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
from typing import Any, ClassVar

import numpy as np

from dsim.engine import compiled_budget, compiled_bundles
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
    "POLICY_SPELLINGS",
    "register_policy",
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


def _n_nondraft(ctx, k):
    n = np.asarray(ctx.n_nondraft, dtype=np.int64).reshape(-1)
    if n.size == 1 and k != 1:
        n = np.full(k, int(n[0]), dtype=np.int64)
    return n


def _n_sampling(ctx, k, R):
    if ctx.n_sampling is None:
        return np.full(k, float(R))
    n = np.asarray(ctx.n_sampling, dtype=np.float64).reshape(-1)
    return np.full(k, float(n[0])) if n.size == 1 and k != 1 else n


def _position_major(conf) -> np.ndarray:
    """[k, R, K] confidences as the kernels' float32 [k, K, R] (contiguous)."""
    return np.ascontiguousarray(np.asarray(conf, dtype=np.float32).transpose(0, 2, 1))


class BudgetPolicy:
    """A verify-budget policy. Declared interface (what the engine reads):

    * ``name``: the policy's name; ``code``: its compiled kernel (dsim.engine.compiled_bundles.POLICY_CODES);
    * ``reads_prev`` / ``reads_prev2``: the budget reads the confidences of one / two steps earlier
      (the engine keeps those rows per decode slot only when asked);
    * ``tau``: the threshold policy's survival threshold (0 for the others);
    * ``samples_all``: E(b) counts every scheduled request as sampling (the paper's tau* = R + ...)
      instead of ``PolicyContext.n_sampling``;
    * ``cost_row(n_requests, n0, n1, engine_row)``: the step cost of n0..n1-1 tokens the policy
      prices budgets with; ``engine_row`` is the engine's (the cost model's step cost, drafter
      and CPU overhead included), returned as is unless the policy has its own table;
    * ``own_cost_row``: ``cost_row`` is the policy's own table, not ``engine_row``;
    * ``prices_context``: the cost row depends on the step's KV context (inside a decode window
      each step's row is then shifted by its own context's cost; a table priced at a fixed
      context is not);
    * ``spellings``: the ``--policy`` names that make this policy, each with the options it implies
      (``paper-production`` is ``paper`` with ``production=True``); empty: just ``name``;
    * ``windows(conf_now, conf_prev, conf_prev2, ctx) -> int64[k, R]``:
      pre: ``conf_now`` float [k, R, K] in [0, 1] (``conf_prev`` / ``conf_prev2`` alike when the
      policy reads them; ``None`` stands for the one after it), ``ctx.k_max >= 0``, ``ctx.token_limit
      >= 0``; post: ``0 <= l[t, r] <= min(K, k_max)`` and each step's verified tokens
      ``sum_r l[t, r] + N[t]`` within ``ctx.token_limit`` where the windows were trimmed (FCFS);
      deterministic (no randomness).

    A policy is one subclass with ``name`` and ``code`` (its branch in the compiled kernel:
    ``dsim.engine.compiled_bundles.POLICY_CODES``, one code per spelling), decorated with
    ``@register_policy``; ``tests/test_registry.py`` checks every registered spelling against the
    kernel's codes and switch.
    """

    name = "base"
    code = -1
    spellings: ClassVar[dict[str, dict[str, Any]]] = {}
    reads_prev = False
    reads_prev2 = False
    samples_all = False
    own_cost_row = False
    prices_context = True
    tau = 0.0

    def cost_row(self, n_requests: int, n0: int, n1: int, engine_row: np.ndarray) -> np.ndarray:
        return engine_row

    def windows(
        self,
        conf_now: np.ndarray,
        conf_prev: np.ndarray | None = None,
        conf_prev2: np.ndarray | None = None,
        ctx: PolicyContext | None = None,
    ) -> np.ndarray:
        """Windows of k steps from [k, R, K] confidences (float32; other float types are cast):
        the compiled kernel ``dsim.engine.compiled_budget.policy_windows`` on each step's cost row
        draft_ms + verify_ms(N + b) (the policy's own table where it has one), b = 0..R x K."""
        now = np.asarray(conf_now)
        if now.ndim != 3:
            raise ValueError(f"conf must be [k, R, K], got shape {now.shape}")
        k, R, K = now.shape
        prev = now if conf_prev is None else conf_prev
        old = prev if conf_prev2 is None else conf_prev2
        N = _n_nondraft(ctx, k)
        kk = min(K, int(ctx.k_max))
        b = np.arange(R * max(kk, 0) + 1)
        tokens = N[:, None] + b[None, :]
        d = float(ctx.draft_ms)
        rows = np.stack(
            [
                np.asarray(
                    self.cost_row(R, int(n), int(n) + len(b), d + np.asarray(ctx.verify_ms(t), dtype=np.float64)),
                    dtype=np.float64,
                )
                for n, t in zip(N, tokens)
            ]
        )
        extra = (
            np.zeros(k) if ctx.step_extra_ms is None else np.asarray(ctx.step_extra_ms, dtype=np.float64).reshape(-1)
        )
        n_samp = np.full(k, float(R)) if self.samples_all else _n_sampling(ctx, k, R)
        out = np.zeros((k, R), dtype=np.int64)
        confs = (_position_major(now), _position_major(prev), _position_major(old))  # (a PolicyConfidences)
        budget = (rows, extra, n_samp, N, int(ctx.token_limit))  # (a PolicyBudget, per step)
        compiled_budget.policy_windows(self.code, float(self.tau), confs, budget, int(ctx.k_max), out)
        return out


POLICIES: dict[str, type[BudgetPolicy]] = {}  # name -> class, in registration order
POLICY_SPELLINGS: dict[str, tuple[type[BudgetPolicy], dict[str, Any]]] = {}  # spelling -> (class, options)


def register_policy(cls: type[BudgetPolicy]) -> type[BudgetPolicy]:
    """Register a BudgetPolicy subclass under its ``name`` and its ``spellings``."""
    if cls.name in POLICIES:
        raise ValueError(f"policy {cls.name!r} registered twice")
    POLICIES[cls.name] = cls
    for spelling, implied in (cls.spellings or {cls.name: {}}).items():
        if spelling in POLICY_SPELLINGS:
            raise ValueError(f"policy spelling {spelling!r} registered twice")
        POLICY_SPELLINGS[spelling] = (cls, dict(implied))
    return cls


@register_policy
class FixedPolicy(BudgetPolicy):
    """Verify all K drafts (fixed block), FCFS-trimmed only if the token limit binds."""

    name = "fixed"
    code = compiled_bundles.FIXED


@register_policy
class ThresholdPolicy(BudgetPolicy):
    """Verify while survival >= tau (default 0.3), FCFS-trimmed to the token limit."""

    name = "threshold"
    code = compiled_bundles.THRESHOLD

    def __init__(self, tau: float = 0.3):
        if not (0.0 <= tau <= 1.0):
            raise InputError(f"policy threshold: tau must be in [0, 1], got {tau}")
        self.tau = float(tau)


@register_policy
class VllmPolicy(BudgetPolicy):
    """vLLM 0.33 adaptive verification (budget from the previous step's confidences)."""

    name = "vllm"
    code = compiled_bundles.VLLM
    reads_prev = True


@register_policy
class PaperPolicy(BudgetPolicy):
    """DSpark Algorithm 1 (early stop) or its section 5.2 production form (budget from the
    confidences two steps old, no early stop)."""

    name = "paper"
    spellings = {"paper": {}, "paper-production": {"production": True}}
    samples_all = True

    def __init__(self, production: bool = False):
        self.production = bool(production)
        self.code = compiled_bundles.PAPER_PRODUCTION if self.production else compiled_bundles.PAPER
        self.reads_prev2 = self.production


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
        cls,
        cost: Any,
        method: Any = None,
        max_requests: int = 1024,
        max_tokens: int = 8192,
        kv_ms_per_request: float = 0.0,
    ) -> AdditiveCost:
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


@register_policy
class SglangPolicy(BudgetPolicy):
    """Same E/C objective on the current confidences, additive cost table (see AdditiveCost)."""

    name = "sglang"
    code = compiled_bundles.SGLANG

    def __init__(self, cost: AdditiveCost | None = None):
        self.cost = cost
        self.own_cost_row = cost is not None
        self.prices_context = cost is None

    def cost_row(self, n_requests: int, n0: int, n1: int, engine_row: np.ndarray) -> np.ndarray:
        """T(R, M) for M = n0..n1-1 from the additive table (the engine's row without one)."""
        if self.cost is None:
            return engine_row
        return np.asarray(self.cost(n_requests, np.arange(n0, n1)), dtype=np.float64)


def make_policy(name: str, **opts: Any) -> BudgetPolicy:
    """``fixed``; ``threshold`` (tau=0.3); ``vllm``; ``paper`` (production=False);
    ``paper-production``; ``sglang`` (cost=AdditiveCost or None): any spelling in
    ``POLICY_SPELLINGS``. Unknown names or options raise InputError."""
    key = str(name).strip().lower()
    if key not in POLICY_SPELLINGS:
        raise InputError(f"policy: unknown policy {name!r} (choose from {', '.join(POLICIES)})")
    cls, implied = POLICY_SPELLINGS[key]
    try:
        return cls(**{**opts, **implied})
    except TypeError as e:
        raise InputError(f"policy {cls.name}: {e}") from None


VERIFY_MODES = tuple(compiled_bundles.VERIFY_CODES)  # the compiled kernels' verify modes, in code order


def verify_tokens_and_commit(mode: str, windows: np.ndarray, K: int) -> tuple[np.ndarray, np.ndarray]:
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
