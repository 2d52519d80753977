"""The drafters' step tables of a composed profile: the ops of one MTP, EAGLE-3 or DSpark draft step
for R requests (``draft_ops``), priced at the drafter request sizes (``draft_tables``).
"""

from __future__ import annotations

import numpy as np

from dsim.cost import Table, drafter_request_sizes
from dsim.profiling.forward import GRAPH_GAP_US_PER_LAYER, LayerGlue
from dsim.profiling.kernel_ops import Op, kernel_op, layer_ops
from dsim.profiling.models import MoEModel
from dsim.profiling.pricer import Pricer, priced_total
from dsim.profiling.topology import Topology

# drafter request counts: vLLM's CUDA-graph capture sizes (a drafter's batch is padded to the next
# one, as the target's), then coarser to 1024; the cost model reads the next size at or above
DRAFT_REQUESTS = tuple(drafter_request_sizes(512, 1024))
DRAFT_COLLECTED_REQUESTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def draft_ops(
    model: MoEModel,
    topo: Topology,
    hardware: str,
    kind: str,
    R: int,
    block: int,
    moe_chunk: int = 0,
    flat_attention: bool = False,
) -> list[Op]:
    """Draft ops for R requests. mtp: the MTP module (one decoder layer + a projection of
    [hidden, embedding]) over R tokens, then the LM head. dspark: the parallel backbone — three
    MoE layers with sliding-window attention and hyper-connections (DSpark paper, Sec. 5.1) — over
    the R x block positions (the anchor is the first prediction position, so a block of `block`
    inputs yields `block` drafts, Sec. 3.1), the LM head over them; the tiny sequential head is
    the 1% the engine adds. eagle3: one decoder layer + LM head over R tokens per sequential draft
    step. `flat_attention`: the block's positions attend as one-token decodes (the rule
    --verify-attention tokens applies to verify windows: DeepSeek's V4 kernels take a step's
    tokens as independent elements, DSpark paper Sec. 5.3), not as q-token windows."""
    last = model.layers - 1
    if kind in ("mtp", "eagle3"):
        ops = layer_ops(model, topo, hardware, R, layers=[last], moe_chunk=moe_chunk)
        ops.append(kernel_op("mtp_proj", 1, op="gemm", dtype="fp8", m=int(R), n=model.hidden, k=2 * model.hidden))
        ops.append(
            kernel_op("lm_head", 1, op="gemm", dtype="bf16", m=int(R), n=model.vocab // topo.attn_tp, k=model.hidden)
        )
        return ops
    n = R * block
    swa = [i for i, k in enumerate(model.attn_kinds) if k in ("v4_swa", "mla")][:1] or [last]
    ops = []
    batch, q = (n, 1) if flat_attention else (R, block)
    for _ in range(3):
        ops += layer_ops(model, topo, hardware, n, layers=swa, batch=batch, q=q, moe_chunk=moe_chunk)
    ops.append(
        kernel_op("lm_head", 1, op="gemm", dtype="bf16", m=int(n), n=model.vocab // topo.attn_tp, k=model.hidden)
    )
    return ops


def draft_tables(
    model: MoEModel,
    topo: Topology,
    hardware: str,
    pricer: Pricer,
    glue: LayerGlue,
    draft_block: int,
    chunk: int,
    flat_attention: bool,
) -> dict[str, Table]:
    """The drafters' step tables at DRAFT_REQUESTS (non-decreasing): mtp, eagle3, dspark (also as "block") over
    blocks of draft_block positions, and dspark@K for each fixed length K < draft_block; each draft layer
    pays a graph gap and the layer glue (MoE in chunks of `chunk` tokens per rank; `flat_attention`: the
    block's positions attend as one-token decodes, see draft_ops)."""
    draft = {}
    for kind in ("mtp", "eagle3", "dspark"):
        ms = [
            priced_total(
                model,
                topo,
                hardware,
                draft_ops(model, topo, hardware, kind, R, draft_block, chunk, flat_attention),
                pricer,
            )
            + (3 if kind == "dspark" else 1)
            * (GRAPH_GAP_US_PER_LAYER * 1e-3 + glue.ms(R * (draft_block if kind == "dspark" else 1)))
            for R in DRAFT_REQUESTS
        ]
        draft[kind] = Table(np.array(DRAFT_REQUESTS, dtype=float), np.maximum.accumulate(np.array(ms)))
    draft["block"] = draft["dspark"]
    # a fixed-length DSpark of K < draft_block drafts K positions per request (vLLM's DSpark proposer
    # runs the parallel backbone over batch x num_speculative_tokens positions): one table per K
    for kb in range(1, draft_block):
        ms = [
            priced_total(model, topo, hardware, draft_ops(model, topo, hardware, "dspark", R, kb, chunk), pricer)
            + 3 * (GRAPH_GAP_US_PER_LAYER * 1e-3 + glue.ms(R * kb))
            for R in DRAFT_REQUESTS
        ]
        draft[f"dspark@{kb}"] = Table(np.array(DRAFT_REQUESTS, dtype=float), np.maximum.accumulate(np.array(ms)))
    return draft
