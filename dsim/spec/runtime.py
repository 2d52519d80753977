"""The speculative runtime an engine replica uses: ``SpecConfig`` (what the user asks for; the one
home of ``verify_mode``) and ``SpecRuntime.build(config, class_names, cost, ...)`` (the method, its
acceptance model with its confidence head, the verify-budget policy and the verify mode)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dsim.errors import InputError
from dsim.spec import budget as P
from dsim.spec.acceptance import AcceptanceCurves, AcceptanceModel, load_acceptance
from dsim.spec.heads import NO_HEAD
from dsim.spec.methods import SpecMethod, acceptance_name, make_method

__all__ = ["SpecConfig", "SpecRuntime"]


@dataclass(frozen=True)
class SpecConfig:
    """What the user asks for: the method, its verify policy and mode, the acceptance curves and
    the confidence head's quality. ``verify_mode`` (SGLang's static | compact | cap-accept) lives
    here only: the engine reads it from the runtime built from this."""

    method: str = "none"  # none | mtp | eagle3 | block | dspark
    k: int | None = None  # drafts per step (default: 1 for mtp, 7 otherwise)
    adaptive: bool = False  # dspark: verify windows chosen per step by `policy`
    policy: str = "vllm"  # vllm | paper | paper-production | sglang | fixed | threshold
    verify_mode: str = "compact"  # static | compact | cap-accept
    acceptance: str | None = None  # preset name, file, inline curves or const:P
    head: str = "model"  # a name in dsim.spec.heads.HEADS
    head_auc: float = 0.85
    head_ece: float = 0.01
    sigma_request: float | None = None
    sigma_step: float | None = None


@dataclass(frozen=True)
class SpecRuntime:
    """The speculative method, its acceptance model, verify-budget policy and verify mode, as an
    engine replica uses them. ``acceptance``, ``curves`` are None without drafts; ``policy`` is
    None unless the method is adaptive. Build with ``SpecRuntime.build``."""

    method: SpecMethod
    verify_mode: str
    acceptance: AcceptanceModel | None = None
    curves: AcceptanceCurves | None = None
    policy: object | None = None  # dsim.spec.budget.BudgetPolicy

    @property
    def k(self) -> int:
        return self.method.k

    @classmethod
    def build(
        cls,
        sc: SpecConfig,
        class_names: Sequence[str],
        cost: Any = None,
        *,
        max_num_seqs: int = 1024,
        max_num_batched_tokens: int = 8192,
        mean_context: float = 0.0,
    ) -> SpecRuntime:
        """From a SpecConfig for a workload's classes. ``cost`` (a CostModel) prices SGLang's
        additive table, built for ``max_num_seqs`` requests, ``max_num_batched_tokens`` tokens and
        a request's context read at ``mean_context`` tokens."""
        if sc.verify_mode not in P.VERIFY_MODES:
            raise InputError(f"--verify-mode: must be static, compact or cap-accept, got {sc.verify_mode!r}")
        method = make_method(sc.method, sc.k, sc.adaptive)
        if not method.drafts:
            return cls(method, sc.verify_mode)
        curves = load_acceptance(acceptance_name(sc.acceptance, method.name), method.name)
        opts = {}
        if sc.sigma_request is not None:
            opts["sigma_request"] = sc.sigma_request
        if sc.sigma_step is not None:
            opts["sigma_step"] = sc.sigma_step
        # Only a method with a confidence head calibrates one; the others are modelled with NO_HEAD.
        head = sc.head if method.has_head else NO_HEAD
        acceptance = AcceptanceModel(
            curves, class_names, method.k, head=head, head_auc=sc.head_auc, head_ece=sc.head_ece, **opts
        )
        policy = None
        if method.adaptive:
            if sc.policy == "sglang" and cost is not None:
                # SGLang prices a step with an additive table T(R, M) = bias + alpha(R) + theta(M),
                # built here from the profile; alpha carries the drafter and the context read
                # of a request at the workload's mean context.
                table = P.AdditiveCost.from_cost(
                    cost,
                    method,
                    max_requests=max_num_seqs,
                    max_tokens=max_num_batched_tokens,
                    kv_ms_per_request=cost.kv_ms_per_tok * mean_context,
                )
                policy = P.make_policy("sglang", cost=table)
            else:
                policy = P.make_policy(sc.policy)
        return cls(method, sc.verify_mode, acceptance, curves, policy)
