"""Speculative methods: what each is (``MethodKind``, one registration per method with
``register_method``; ``METHODS`` generated from the registry) and its draft cost.

Public API (see docs/dev/architecture.md, "Spec interface"):

* ``make_method(name, k=None, adaptive=False) -> SpecMethod``; ``SpecMethod.draft_ms(cost, n)``.
* ``acceptance_name(acceptance, method)``: the acceptance preset a method is sized on.

The acceptance model is dsim.spec.acceptance, the confidence heads dsim.spec.heads, and the
runtime an engine replica uses (``SpecConfig``, ``SpecRuntime``) dsim.spec.runtime.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dsim.errors import InputError

__all__ = [
    "METHODS",
    "METHOD_KINDS",
    "MethodKind",
    "register_method",
    "SpecMethod",
    "make_method",
    "acceptance_name",
    "canonical_method",
]

# --------------------------------------------------------------------------------------------
# Methods and draft cost
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MethodKind:
    """What a speculative method is, declared once where it is registered (``register_method``):

    * ``name``: its ``--methods`` / ``make_method`` name; ``aliases``: other spellings;
    * ``default_k``: drafts per request per step when k is not given (0: it does not draft);
    * ``k_max``: the largest k it takes (k in 1..k_max for a drafting method);
    * ``has_head``: its drafter carries a confidence head (its confidences are sampled by the
      head model and scored; adaptive verification needs one);
    * ``model_head``: it needs layers trained for the target model (its own MTP layers, a DSpark
      drafter: ``dsim.spec.capability.method_fit`` checks the profile for them);
    * ``acceptance``: the acceptance preset it is sized on unless one is given.

    Its draft cost is ``SpecMethod.draft_ms`` (the profile's drafter table, else a stated
    fraction of a target forward)."""

    name: str
    default_k: int
    k_max: int
    has_head: bool
    model_head: bool
    acceptance: str
    aliases: tuple[str, ...] = ()


METHOD_KINDS: dict[str, MethodKind] = {}  # name -> kind, in registration order
_ALIASES: dict[str, str] = {}  # other spellings -> name


def register_method(kind: MethodKind) -> MethodKind:
    """Register a method kind under its name and aliases."""
    for spelling in (kind.name, *kind.aliases):
        if spelling in METHOD_KINDS or spelling in _ALIASES:
            raise ValueError(f"method spelling {spelling!r} registered twice")
    METHOD_KINDS[kind.name] = kind
    _ALIASES.update({a: kind.name for a in kind.aliases})
    return kind


register_method(
    MethodKind(
        "none", default_k=0, k_max=0, has_head=False, model_head=False, acceptance="deepseek-v4", aliases=("no", "off")
    )
)
register_method(
    MethodKind(
        "mtp",
        default_k=1,
        k_max=16,
        has_head=False,
        model_head=True,
        acceptance="deepseek-v4",
        aliases=("mtp1", "mtp-1"),
    )
)
register_method(
    MethodKind(
        "eagle3",
        default_k=7,
        k_max=16,
        has_head=False,
        model_head=False,
        acceptance="qwen3-4b-fig2",
        aliases=("eagle", "eagle-3"),
    )
)
register_method(
    MethodKind(
        "block",
        default_k=7,
        k_max=16,
        has_head=False,
        model_head=False,
        acceptance="qwen3-4b-fig2",
        aliases=("dflash",),
    )
)
register_method(
    MethodKind("dspark", default_k=7, k_max=16, has_head=True, model_head=True, acceptance="deepseek-v4", aliases=())
)
METHODS = tuple(METHOD_KINDS)
DEFAULT_ACCEPTANCE = {name: kind.acceptance for name, kind in METHOD_KINDS.items()}


def acceptance_name(acceptance: str | None, method: str) -> str:
    """The acceptance a method (a SpecMethod name) is sized on: the one given, else its default
    preset (DEFAULT_ACCEPTANCE)."""
    return acceptance or DEFAULT_ACCEPTANCE.get(method, "deepseek-v4")


def canonical_method(spelling: Any) -> str:
    """A method's registered name for any of its spellings (lower-cased); other text as given,
    lower-cased."""
    key = str(spelling).lower()
    return _ALIASES.get(key, key)


# Default draft-cost fractions of a target forward, used only when the cost profile has no
# table for the method (cost.draft_table_ms(kind, n) returns None).
MTP_FRACTION_PER_DRAFT = 0.05
"""MTP: one MTP module (one transformer layer + the shared output head) per draft. A 61-layer
model's layer is 1/61 = 1.6% of the weights, but the vocabulary projection and the small-batch
fixed cost make the measured share larger; we use 0.05 x forward(n_requests) per draft."""
EAGLE3_FRACTION_PER_STEP = 0.06
"""EAGLE-3: K sequential forwards of a one-layer draft head over n_requests tokens each, each
about 0.06 x a target forward of n_requests tokens (small-batch decode is weight-read and
launch bound, so a 1-layer head plus the LM head costs several % of the target)."""
BLOCK_FRACTION = 0.12
"""Block drafter (DFlash): one parallel pass of a deeper (about 5-layer) drafter over
n_requests x K tokens, about 0.12 x a target forward of n_requests x K tokens."""
DSPARK_OVERHEAD = 0.01
"""DSpark: the block pass plus a tiny sequential confidence/refinement head; DSpark paper Fig. 4
reports +0.2-1.3% end-to-end latency over the parallel drafter; we add 1% to the block cost."""


@dataclass(frozen=True)
class SpecMethod:
    """A speculative method: ``name`` in METHODS, ``k`` drafts per request per step (0 for none),
    ``adaptive``: verify window chosen per step by a budget policy (DSpark only)."""

    name: str
    k: int
    adaptive: bool = False

    @property
    def drafts(self) -> bool:
        """The method drafts tokens (every method but none)."""
        return self.k > 0

    @property
    def has_head(self) -> bool:
        """The method's drafter carries a confidence head (``MethodKind.has_head``: DSpark only): its
        confidences are sampled by the head model and scored (AUC, ECE); the others use the class curve."""
        return METHOD_KINDS[self.name].has_head

    @property
    def model_head(self) -> str | None:
        """What the method needs of the target model (dsim.capability checks it): ``mtp`` its own
        MTP layers, ``dspark`` a DSpark drafter trained for it; None for the others (no drafts, or a
        separate draft model that can be trained for any target)."""
        return self.name if METHOD_KINDS[self.name].model_head else None

    def draft_ms(self, cost: Any, n_requests: int) -> float:
        """Draft time (ms) for one step with ``n_requests`` decoding requests.

        ``cost`` is duck-typed: ``cost.draft_table_ms(kind, n) -> float | None`` (profiled table,
        None when absent) and ``cost.forward_ms(n_tokens) -> float`` (target forward at zero
        context). Tables: mtp = one MTP layer for k = 1 (x k); eagle3 = ONE sequential draft step
        (x K); block = one parallel pass; dspark = its own table (a fixed K: the profile's K-position table
        ``dspark@K`` where it has one), else the block table x 1.01.
        Without tables the module-level fractions above apply.
        """
        n = int(n_requests)
        if self.name == "none" or self.k <= 0 or n <= 0:
            return 0.0
        table = getattr(cost, "draft_table_ms", None)

        def tab(kind: str) -> float | None:
            return None if table is None else table(kind, n)

        k = self.k
        if self.name == "mtp":
            t = tab("mtp")
            return float(k * t) if t is not None else float(k * MTP_FRACTION_PER_DRAFT * cost.forward_ms(n))
        if self.name == "eagle3":
            t = tab("eagle3")
            return float(k * t) if t is not None else float(k * EAGLE3_FRACTION_PER_STEP * cost.forward_ms(n))
        if self.name == "block":
            t = tab("block")
            return float(t) if t is not None else float(BLOCK_FRACTION * cost.forward_ms(n * k))
        if self.name == "dspark":
            # K shorter than the profile's draft block: the drafter runs K positions per request
            t = tab(f"dspark@{k}")
            if t is None:
                t = tab("dspark")
            if t is not None:
                return float(t)
            t = tab("block")
            base = t if t is not None else BLOCK_FRACTION * cost.forward_ms(n * k)
            return float(base * (1.0 + DSPARK_OVERHEAD))
        raise InputError(f"method: unknown method {self.name!r}")

    def draft_ms_upto(self, cost: Any, n_max: int) -> np.ndarray:
        """``draft_ms(cost, n)`` for n = 0..n_max as one float64 array: from the profile's table in
        one vectorized pass (``cost.draft_table_ms_upto``, the same operations element by element),
        else size by size."""
        upto = getattr(cost, "draft_table_ms_upto", None)
        k = self.k
        if self.name != "none" and k > 0 and upto is not None:
            if self.name in ("mtp", "eagle3"):
                t = upto(self.name, n_max)
                if t is not None:
                    return k * t
            elif self.name == "block":
                t = upto("block", n_max)
                if t is not None:
                    return t
            elif self.name == "dspark":
                t = upto(f"dspark@{k}", n_max)
                if t is None:
                    t = upto("dspark", n_max)
                if t is not None:
                    return t
        return np.array([self.draft_ms(cost, n) for n in range(n_max + 1)], dtype=np.float64)


def make_method(name: str, k: int | None = None, adaptive: bool = False) -> SpecMethod:
    """Build a SpecMethod. ``name``: none, mtp, eagle3, block (alias dflash), dspark.
    ``k`` defaults to 1 for mtp and 7 for eagle3/block/dspark (the paper's block size).
    ``adaptive=True`` is only meaningful for dspark (the only method with a confidence head)."""
    key = canonical_method(str(name).strip())
    if key not in METHODS:
        raise InputError(f"method: unknown method {name!r} (choose from {', '.join(METHODS)}, dflash)")
    if key == "none":
        if adaptive:
            raise InputError("method: adaptive verification needs drafts (method none has none)")
        return SpecMethod("none", 0, False)
    kind = METHOD_KINDS[key]
    kk = kind.default_k if k is None else int(k)
    if kk < 1 or kk > kind.k_max:
        raise InputError(f"method: k must be in 1..{kind.k_max} for {key}, got {k}")
    m = SpecMethod(key, kk, bool(adaptive))
    if adaptive and not m.has_head:
        raise InputError(f"method: adaptive verification needs a confidence head (dspark), not {key}")
    return m


# --------------------------------------------------------------------------------------------
# Acceptance curves (presets, files, inline strings)
# --------------------------------------------------------------------------------------------
