"""Deployment topologies of a MoE model (``Topology``; a node of ``GPUS_PER_NODE`` GPUs) and the routed
experts an expert-parallel group holds.

- ``tpN-epN``: attention tensor-parallel over N GPUs (query heads split, the single-head / latent
  KV cache replicated on every rank, as vLLM does for MLA), experts split over the same N GPUs;
  all-reduce after attention and after the MoE. One engine replica = N GPUs.
- ``dpN-epN``: attention data-parallel (each GPU an attention rank with its own requests and its
  own KV cache: one engine replica per GPU), experts split over the N GPUs, tokens exchanged by
  all-to-all dispatch/combine (DeepEP-style; DeepSeek-V3 report, Sec. 3.4, decodes this way).
  Assumption: the N ranks step in lockstep with similar batches (their MoE and all-to-all join
  every rank's tokens), so a rank with n tokens is priced as N x n tokens entering the experts.
- ``tpA-dpB-epN``: both, attention tensor-parallel over A GPUs inside each of B data-parallel ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsim.errors import InputError
from dsim.profiling.models import MoEModel

GPUS_PER_NODE = 8


@dataclass(frozen=True)
class Topology:
    name: str
    attn_tp: int
    attn_dp: int
    ep: int

    @property
    def gpus(self) -> int:
        return self.attn_tp * self.attn_dp

    @property
    def gpus_per_replica(self) -> int:
        return self.attn_tp

    @property
    def nodes(self) -> int:
        """8-GPU nodes one expert-parallel group spans."""
        return max(1, -(-self.gpus // GPUS_PER_NODE))

    def describe(self) -> str:
        span = f" across {self.nodes} nodes" if self.nodes > 1 else ""
        if self.attn_dp > 1:
            rep = "one GPU" if self.attn_tp == 1 else f"{self.attn_tp} GPUs (tensor-parallel attention)"
            return (
                f"data-parallel attention over {self.attn_dp} ranks of {rep}, each an engine replica with its "
                f"own KV cache; experts over EP{self.ep}{span}, all-to-all dispatch/combine"
            )
        return (
            f"tensor-parallel attention over {self.attn_tp} GPUs (KV cache replicated per rank), experts over "
            f"EP{self.ep}, all-reduce after attention and MoE"
        )


def parse_topology(s: str) -> Topology:
    """``tpA-epN``, ``dpB-epN`` or ``tpA-dpB-epN`` with A x B = N (attention TP inside each DP rank)."""
    t = str(s).strip().lower()
    parts = t.split("-")
    try:
        vals = {p[:2]: int(p[2:]) for p in parts}
        if len(vals) != len(parts) or set(vals) - {"tp", "dp", "ep"} or "ep" not in vals or len(parts) < 2:
            raise ValueError
        tp, dp, ep = vals.get("tp", 1), vals.get("dp", 1), vals["ep"]
        if min(tp, dp, ep) < 1 or tp * dp != ep:
            raise ValueError
    except ValueError:
        raise InputError(
            f"topology {s!r}: expected tpN-epN, dpN-epN or tpA-dpB-epN with A x B = N "
            "(e.g. tp8-ep8, dp8-ep8, tp2-dp8-ep16)"
        ) from None
    return Topology(t, tp, dp, ep)


def physical_experts(model: MoEModel, topo: Topology) -> int:
    """The routed experts an EP group holds: the model's, or where they do not divide over the EP
    ranks, the fewest redundant copies that give every rank the same count (DeepSeek's decode layout:
    EP144, 256 experts + 32 redundant, 2 per GPU; the inference-system overview, open-infra-index).
    The copies go to the most loaded experts (EPLB), so routing stays uniform over the copies."""
    e, ep = model.experts, topo.ep
    return e if e % ep == 0 else -(-e // ep) * ep
