"""Two-batch overlap of a composed forward (``--overlap dbo``): each decoder layer as two micro-batches on
vLLM's DBO schedule, the all-to-all of one hidden behind the other's compute (``forward_ms_dbo``), and the
forward table with it from a threshold on (``overlapped_forward``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from dsim.errors import InputError
from dsim.profiling.forward import EAGER_US_PER_LAYER, GRAPH_GAP_US_PER_LAYER, LayerGlue, forward_ms
from dsim.profiling.kernel_ops import KV_LO, layer_ops, step_ops
from dsim.profiling.models import MoEModel
from dsim.profiling.pricer import Pricer, priced_total
from dsim.profiling.request_attention import REQ_CTX
from dsim.profiling.topology import Topology

if TYPE_CHECKING:
    from collections.abc import Sequence


# DeepSeek-V3 report Sec. 3.4 (decoding: two micro-batches, the attention of one overlapped with
# the dispatch + MoE + combine of the other; DeepEP's low-latency all-to-all) and vLLM's dual
# batch overlap (`--enable-dbo`, vLLM docs "Dual Batch Overlap": DP + EP deployments only). vLLM splits a step
# into two micro-batches only from `dbo_decode_token_threshold` tokens per rank (ParallelConfig
# default 32 for decode-only batches; 512, `dbo_prefill_token_threshold`, once a prefill is in it).
OVERLAPS = ("none", "dbo")
DBO_DECODE_TOKEN_THRESHOLD = 32
A2A_KINDS = ("a2a_dispatch", "a2a_combine")


@dataclass(frozen=True)
class MicroBatchLayer:
    """One decoder layer of one micro-batch, in the pieces vLLM's DBO schedule interleaves (ms):
    attention side (projections, core attention, router; vLLM's A0 + A1), routed experts (MLP),
    shared expert (S), dispatch (D) and combine (C)."""

    attention_ms: float
    experts_ms: float
    shared_ms: float
    dispatch_ms: float
    combine_ms: float


def micro_batch_layer(
    model: MoEModel,
    topo: Topology,
    hardware: str,
    n: int,
    pricer: Pricer,
    layer: int,
    *,
    q: int = 1,
    kv: int = KV_LO,
    moe_chunk: int = 0,
) -> MicroBatchLayer:
    """The pieces of decoder layer `layer` for a micro-batch of n tokens (ceil(n / q) requests), its
    MoE block in chunks of moe_chunk tokens (0: one pass)."""
    qq = max(1, min(int(q), int(n)))
    parts = dict(attention=0.0, experts=0.0, shared=0.0, dispatch=0.0, combine=0.0)
    for op in layer_ops(
        model, topo, hardware, n, kv=kv, q=qq, batch=-(-int(n) // qq), layers=[layer], moe_chunk=moe_chunk
    ):
        v = priced_total(model, topo, hardware, [op], pricer)
        kind = op.rec.get("kind")
        if op.part == "moe_experts":
            parts["experts"] += v
        elif op.part == "shared_expert":
            parts["shared"] += v
        elif op.part == "comm" and kind in A2A_KINDS:
            parts["dispatch" if kind == "a2a_dispatch" else "combine"] += v
        else:
            parts["attention"] += v
    return MicroBatchLayer(*(parts[k] for k in ("attention", "experts", "shared", "dispatch", "combine")))


def dbo_layer_ms(mb0: MicroBatchLayer, mb1: MicroBatchLayer) -> float:
    """One layer of two micro-batches on vLLM's DBO schedule (vLLM docs, "Dual Batch Overlap"): compute stream
    A(0) | MLP(1) | S(1) MLP(0) | S(0) A(1), communication stream D(1) | D(0) | C(1) | C(0), each
    stage as long as the longer of its two streams (communication assumed not to slow the
    compute it overlaps: DeepEP's low-latency kernels move data without the compute's SMs).
    Without all-to-all (a dense layer, TP attention) the two micro-batches run back to back."""
    if not (mb0.dispatch_ms or mb0.combine_ms or mb1.dispatch_ms or mb1.combine_ms):
        return sum(m.attention_ms + m.experts_ms + m.shared_ms for m in (mb0, mb1))
    return (
        max(mb0.attention_ms, mb1.dispatch_ms)
        + max(mb1.experts_ms, mb0.dispatch_ms)
        + max(mb1.shared_ms + mb0.experts_ms, mb1.combine_ms)
        + max(mb0.shared_ms + mb1.attention_ms, mb0.combine_ms)
    )


def dbo_attention_margin_ms(mb0: MicroBatchLayer, mb1: MicroBatchLayer) -> float:
    """How much longer each micro-batch's attention (with what shares its stage) runs than the
    all-to-all it overlaps on dbo_layer_ms's schedule: min(A0 - D1, S0 + A1 - C0). While it is
    >= 0 the attention is on the layer's critical path, so a change in it changes the layer by as
    much (what the per-request attention correction of a format-3 profile assumes); below 0 the
    all-to-all hides part of it."""
    return min(mb0.attention_ms - mb1.dispatch_ms, mb0.shared_ms + mb1.attention_ms - mb0.combine_ms)


def forward_ms_dbo(
    model: MoEModel,
    topo: Topology,
    hardware: str,
    n: int,
    pricer: Pricer,
    limit: int,
    *,
    kv: int = KV_LO,
    glue: LayerGlue = LayerGlue(),
    q: int = 1,
    threshold: int = DBO_DECODE_TOKEN_THRESHOLD,
    moe_chunk: int = 0,
    eager_us: float = EAGER_US_PER_LAYER,
) -> float:
    """One target forward of n tokens per rank with two-batch overlap: below `threshold` tokens
    the step is not split (forward_ms); from it, every decoder layer runs as two micro-batches of
    ceil(n / 2) and floor(n / 2) tokens (each micro-batch's experts read their weights again, each
    launches its own kernels: graph gaps and layer glue per micro-batch), interleaved as
    dbo_layer_ms; the embedding and LM head run once over all n tokens. Only data-parallel
    attention with expert parallelism has all-to-all to hide (vLLM: DP + EP only)."""
    if n < threshold or topo.attn_dp <= 1 or n < 2:
        return forward_ms(
            model, topo, hardware, n, pricer, limit, kv=kv, glue=glue, q=q, moe_chunk=moe_chunk, eager_us=eager_us
        )
    halves = (-(-int(n) // 2), int(n) // 2)
    # layers of one kind price alike: one micro-batch record per (attention kind, MoE, hash-routed)
    groups: dict = {}
    for i in range(model.layers):
        key = (model.attn_kinds[i], model.moe_layer[i], i < model.hash_layers)
        groups.setdefault(key, [i, 0])[1] += 1
    t = 0.0
    for first, count in groups.values():
        mbs = [
            micro_batch_layer(model, topo, hardware, h, pricer, first, q=q, kv=kv, moe_chunk=moe_chunk) for h in halves
        ]
        t += count * dbo_layer_ms(mbs[0], mbs[1])
    qq = max(1, min(int(q), int(n)))
    bw = -(-int(n) // qq)
    in_layers = set(layer_ops(model, topo, hardware, n, kv=kv, q=qq, batch=bw))
    rest = [op for op in step_ops(model, topo, hardware, n, kv=kv, q=qq, batch=bw) if op not in in_layers]
    t += priced_total(model, topo, hardware, rest, pricer)
    t += model.layers * sum(GRAPH_GAP_US_PER_LAYER * 1e-3 + glue.ms(h) for h in halves)
    if n > limit:
        t += model.layers * eager_us * 1e-3
    return t


def parse_dbo_threshold(value: int | str) -> int | str:
    """--dbo-threshold: a token count >= 1 or 'auto' (see overlapped_forward)."""
    if str(value).strip().lower() == "auto":
        return "auto"
    try:
        t = int(str(value).strip())
    except ValueError:
        t = 0
    if t < 1:
        raise InputError(f"--dbo-threshold: expected a token count >= 1 or 'auto', got {value!r}")
    return t


def overlapped_forward(
    model: MoEModel,
    topo: Topology,
    hardware: str,
    tokens: Sequence[int],
    plain_ms: np.ndarray,
    pricer: Pricer,
    limit: int,
    glue: LayerGlue,
    q: int,
    threshold: int | str,
    *,
    moe_chunk: int = 0,
    decode_tokens_max: int | None = None,
    eager_us: float = EAGER_US_PER_LAYER,
) -> tuple[np.ndarray, str]:
    """The forward table with two-batch overlap from `threshold` tokens per rank on, and the
    provenance line saying so. threshold 'auto': the smallest CUDA-graph size from which the split
    step is no slower than the unsplit one at every larger graph size (the engine's one threshold
    set where splitting pays on this cost curve); none such: never split. With `decode_tokens_max`
    (a profile with the format-3 request table: its per-request attention correction is added in
    full on top of this table) the line also states where that holds: the smallest
    dbo_attention_margin_ms over the split sizes up to that many tokens per rank, at the request
    table's smallest context, where attention is least."""
    if topo.attn_dp <= 1:
        raise InputError(
            f"--overlap dbo: topology {topo.name} has no all-to-all to hide (two-batch overlap needs "
            "data-parallel attention with expert parallelism, e.g. dp8-ep8)"
        )
    split = np.array(
        [
            forward_ms_dbo(
                model,
                topo,
                hardware,
                n,
                pricer,
                limit,
                glue=glue,
                q=q,
                threshold=1,
                moe_chunk=moe_chunk,
                eager_us=eager_us,
            )
            for n in tokens
        ]
    )
    if threshold == "auto":
        # over the decode range (the CUDA-graph sizes): one threshold, as vLLM has
        graphs = [i for i, n in enumerate(tokens) if n <= limit]
        pays = split[graphs] <= plain_ms[graphs]
        start = next((j for j in range(len(graphs)) if pays[j:].all()), None)
        t = int(tokens[graphs[start]]) if start is not None else None
        how = "auto: the smallest CUDA-graph size from which the split step is no slower at every larger one"
    else:
        t, how = (
            int(threshold),
            "vLLM's dbo_decode_token_threshold default" if threshold == DBO_DECODE_TOKEN_THRESHOLD else "given",
        )
    if t is None:
        return (
            plain_ms,
            "two-batch overlap asked, never split (the split step is slower at the largest CUDA-graph size)",
        )
    use = np.array([n >= t and n >= 2 for n in tokens])
    out = np.where(use, split, plain_ms)
    note = (
        f"two-batch overlap (DeepSeek-V3 report Sec. 3.4; vLLM --enable-dbo) from {t} tokens per rank ({how}): "
        "each layer as two micro-batches on vLLM's DBO schedule, dispatch/combine of one hidden behind the "
        "attention, experts and shared expert of the other (no slowdown of the overlapped compute assumed), "
        "experts' weights read per micro-batch; drafter steps not split"
    )
    split_sizes = [int(n) for n in tokens if t <= n <= (decode_tokens_max or 0) and n >= 2]
    if split_sizes:
        worst = min(
            (
                dbo_attention_margin_ms(
                    *(
                        micro_batch_layer(
                            model, topo, hardware, h, pricer, first, q=q, kv=REQ_CTX[0], moe_chunk=moe_chunk
                        )
                        for h in (-(-n // 2), n // 2)
                    )
                ),
                n,
            )
            for n in split_sizes
            for first in _layer_groups(model)
        )
        holds = (
            f"holds: every split size from {split_sizes[0]} to {split_sizes[-1]} tokens per rank keeps each "
            f"micro-batch's attention longer than the all-to-all it overlaps at the request table's smallest "
            f"context ({REQ_CTX[0]}), by at least {worst[0] * 1e3:.0f} us per layer"
            if worst[0] >= 0
            else f"does not hold everywhere: at {worst[1]} tokens per rank and {REQ_CTX[0]} of context the "
            f"all-to-all outlasts the attention by {-worst[0] * 1e3:.0f} us per layer, which the correction "
            "over-charges there by up to as much per layer"
        )
        note += (
            "; the per-request attention correction (format 3: a request's own attention in place of its "
            "share in this table) is added in full on top of the overlapped step, right while attention stays "
            f"on the critical path of its two stages (A0 >= D1, S0 + A1 >= C0), which {holds}"
        )
    return out, note


def _layer_groups(model: MoEModel) -> list[int]:
    """The first layer of each group of layers that price alike (attention kind, MoE, hash-routed)."""
    groups: dict = {}
    for i in range(model.layers):
        groups.setdefault((model.attn_kinds[i], model.moe_layer[i], i < model.hash_layers), i)
    return list(groups.values())
