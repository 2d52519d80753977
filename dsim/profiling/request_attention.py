"""The per-request attention table of a composed profile (format 3, dsim.cost module doc): the attention
cores of all layers at each (batch, q, ctx) and the share of each forward size that is attention
(``request_attention_table``), verify windows priced as one-token decodes where kernels flatten them
(``flattened_verify_attention``), and the lowest profile format that holds the table's terms.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

from dsim.cost import RequestAttention, vllm_capture_sizes
from dsim.profiling.kernel_ops import KV_LO, layer_ops
from dsim.profiling.models import MoEModel
from dsim.profiling.pricer import Pricer, priced_total
from dsim.profiling.topology import Topology

if TYPE_CHECKING:
    from collections.abc import Sequence


# the per-request attention table (profile format 3): batch at vLLM's capture sizes to 512, the query
# tokens of decode / verify windows, contexts where the kernel tables hold attention series
REQ_BATCH_MAX = 512
REQ_Q = (1, 2, 4, 6, 8)
REQ_CTX = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
REQ_CTX_GRID = (512, 2048, 8192, 32768, 131072)  # of them, the kernel-op grid's contexts (KERNEL_OPS)


def attention_cores_ms(model, topo, hardware, pricer, *, phase, batch, q, kv) -> float:
    """The attention cores of every decoder layer for `batch` requests of q tokens over kv cached ones (ms)."""
    ops = [
        op
        for op in layer_ops(model, topo, hardware, batch * q, phase=phase, batch=batch, q=q, kv=kv)
        if op.part == "attn_core"
    ]
    return priced_total(model, topo, hardware, ops, pricer)


def request_attention_table(
    model: MoEModel,
    topo: Topology,
    hardware: str,
    pricer: Pricer,
    tokens: Sequence[int],
    forward_q: int,
    slope_ms_per_tok: float,
    table_pricer: Pricer | None = None,
) -> RequestAttention:
    """The format-3 per-request attention table: the attention cores (all layers) of a step of B
    requests each of q query tokens over ctx cached ones, on the grid (capture sizes to
    REQ_BATCH_MAX) x REQ_Q x REQ_CTX, and the share of each forward-table size that is attention
    (as compose_profile priced it: requests of forward_q tokens at KV_LO, less the KV slope there).
    `table_pricer` prices the table instead of `pricer` (a step_keys profile's records without the
    split-K combine); the share is what the forward table priced, from `pricer`."""
    batch = vllm_capture_sizes(REQ_BATCH_MAX)
    tp = table_pricer or pricer
    tab = np.array(
        [
            [
                [attention_cores_ms(model, topo, hardware, tp, phase="decode", batch=B, q=q, kv=c) for c in REQ_CTX]
                for q in REQ_Q
            ]
            for B in batch
        ]
    )
    share = []
    for n in tokens:
        qq = max(1, min(int(forward_q), int(n)))
        B = -(-int(n) // qq)
        a = attention_cores_ms(model, topo, hardware, pricer, phase="decode", batch=B, q=qq, kv=KV_LO)
        share.append(max(0.0, a - slope_ms_per_tok * B * KV_LO))
    return RequestAttention(
        np.array(batch, dtype=np.int64),
        np.array(REQ_Q, dtype=np.int64),
        np.array(REQ_CTX, dtype=np.int64),
        tab,
        np.array(share),
        source="attention cores of the kernel tables at each (batch, q, ctx), summed over the layers",
    )


def lifted_share(share_ms: np.ndarray, lift_ms: np.ndarray) -> np.ndarray:
    """The forward table's attention share with the part of its non-decreasing lift that is attention.
    A forward size whose attention runs a cheaper regime than a smaller size's (an executor's split-K
    path off past a token count) is held up to the smaller size's price by the non-decreasing table;
    the lift up to the share's own drop below the largest share of a smaller size is attention, so
    the share carries it and a step whose attention the per-request table prices pays the
    non-attention part exactly (the rest of a lift, from a non-attention op, stays in the step)."""
    drop = np.maximum.accumulate(share_ms) - share_ms
    return share_ms + np.minimum(lift_ms, drop)


#: how a verify window of q tokens is priced in the per-request attention table: "window" the kernel
#: tables' q-token attention records; "tokens" each verify token as a one-token decode of its
#: request's context (DeepSeek's V4 kernels, DSpark paper Sec. 5.3: "all tokens across different
#: requests are flattened and processed identically as independent elements", only the indexer and
#: compressor kernels taking a marker of which request a token belongs to)
VERIFY_ATTENTION = ("window", "tokens")


def flattened_verify_attention(
    model: MoEModel, topo: Topology, hardware: str, pricer: Pricer, ra: RequestAttention
) -> RequestAttention:
    """The request table with every q > 1 entry priced as B x q one-token decodes at the same context:
    step_ms[B, q, ctx] = attention(B x q requests of 1 token, ctx). Each query token has its own
    top-k selection and reads its own key list (indexer scores, compressed entries, the 128-token
    window), so that is what a kernel that treats tokens as independent elements does; a kernel
    that reads a request's shared keys (window, indexer keys) once for its q tokens is cheaper, so
    this is an upper bound on such kernels. Past REQ_BATCH_MAX one-token requests (where the
    kernel tables' decode series end) the attention grows in proportion to the requests (a GPU
    already full of them). q = 1 entries and the forward share are unchanged."""
    tab = np.array(ra.step_ms, dtype=float)
    for b, B in enumerate(ra.batch):
        for j, q in enumerate(ra.q):
            if int(q) == 1:
                continue
            n = int(B) * int(q)
            base = min(n, REQ_BATCH_MAX)
            for c, ctx in enumerate(ra.ctx):
                tab[b, j, c] = (
                    attention_cores_ms(model, topo, hardware, pricer, phase="decode", batch=base, q=1, kv=int(ctx))
                    * n
                    / base
                )
    return dataclasses.replace(
        ra,
        step_ms=tab,
        source=ra.source + "; verify windows of q tokens priced as q one-token decodes at the request's context",
    )


def profile_format(req_attn: RequestAttention | None) -> int:
    """The lowest profile format that holds the per-request attention table's terms (dsim.cost)."""
    if req_attn is None:
        return 1
    if req_attn.block_pool is not None:
        return 5
    return 4 if req_attn.indexer_ratio or req_attn.step_keys else 3
