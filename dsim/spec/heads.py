"""The confidence heads a run can model (``--head``, ``SpecConfig.head``): one ``HeadKind`` per
kind, registered with ``register_head``. ``HEADS`` (the names, the command line's choices) and
``HEAD_CODES`` (each kind's branch in the compiled draws, dsim.engine.compiled_draws; the
constants ``HEAD_MODEL`` ... in dsim.engine.compiled_bundles) are generated from the registry. Importing this module loads neither numpy nor
numba: the command line reads its choices here.

The interface, for every head (the draws: dsim.engine.compiled_draws.draw_slots; the fit:
dsim.spec.head_fit.fit_head):

pre: the method drafts (k >= 1). A method whose drafter carries a confidence head
(``MethodKind.has_head``: DSpark) takes the head asked for; any other is modelled with
``NO_HEAD`` (it has no per-request confidence: its confidences are the class curve, which only
the adaptive verify policies would read, and those need a head).
post: confidences float32 [steps, K, n] in [0, 1], one per draft, deterministic for a run key;
exactly P[c, k] where the class curve is 0 or 1. Whatever the head, each draft is accepted with
probability p_true (a noisy head's own draw moves its request's stream, not the outcomes' law).
"""

from __future__ import annotations

from dataclasses import dataclass

from dsim.errors import InputError

__all__ = ["HEADS", "HEAD_CODES", "HEAD_KINDS", "NO_HEAD", "HeadKind", "head_kind", "register_head"]


@dataclass(frozen=True)
class HeadKind:
    """What a confidence head is, declared once where it is registered (``register_head``):

    * ``name``: its ``--head`` name; ``code``: its branch in the compiled draws (``HEAD_CODES``;
      the codes are 0..n-1 in registration order);
    * ``noisy``: its confidence is the true acceptance's logit plus its own normal draw (one more
      normal per draft in the request's stream), with the noise s, offset b and temperature T
      fitted on a calibration sample so its ROC-AUC is ``head_auc`` and its ECE ``head_ece``
      (dsim.spec.head_fit.fit_head); else s = b = 0, T = 1 and the two targets are not read;
    * ``class_curve``: its confidence is the class-position curve P[c, k] (no per-request
      information), carried per decode slot as K more slot-offset rows; else it is computed from
      the draws (p_true, or p_true with the head's noise when ``noisy``)."""

    name: str
    code: int
    noisy: bool
    class_curve: bool


HEAD_KINDS: dict[str, HeadKind] = {}  # name -> kind, in registration (code) order


def register_head(kind: HeadKind) -> HeadKind:
    """Register a head kind under its name; its code must be the next one (0, 1, ...)."""
    if kind.name in HEAD_KINDS:
        raise ValueError(f"head {kind.name!r} registered twice")
    if kind.code != len(HEAD_KINDS):
        raise ValueError(f"head {kind.name!r}: code {kind.code}, expected {len(HEAD_KINDS)} (codes 0..n-1 in order)")
    if kind.noisy and kind.class_curve:
        raise ValueError(f"head {kind.name!r}: a class-curve head draws no noise")
    HEAD_KINDS[kind.name] = kind
    return kind


# a trained head: the true acceptance blurred and tempered to --head-auc and --head-ece
register_head(HeadKind("model", code=0, noisy=True, class_curve=False))
# an oracle: each draft's true acceptance probability (the AUC ceiling)
register_head(HeadKind("perfect", code=1, noisy=False, class_curve=False))
# the class-position curve P[c, k]: no per-request information (the lower bound)
register_head(HeadKind("useless", code=2, noisy=False, class_curve=True))

HEADS = tuple(HEAD_KINDS)  # the --head choices, in code order
HEAD_CODES = {name: kind.code for name, kind in HEAD_KINDS.items()}
NO_HEAD = "useless"  # what a method without a confidence head is modelled with


def head_kind(name: str) -> HeadKind:
    """The registered kind ``name``; InputError naming the choices otherwise."""
    kind = HEAD_KINDS.get(name)
    if kind is None:
        raise InputError(f"head: expected {', '.join(HEADS[:-1])} or {HEADS[-1]}, got {name!r}")
    return kind
