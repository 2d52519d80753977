"""Step-cost composer: a dsim profile for a MoE model under a deployment topology, from kernel tables.

One engine step on one GPU is decomposed into kernel ops (``step_ops``), each op is priced by a
kernel source (a measured/published ``KernelTable``, the ``Roofline`` for what a table lacks),
and the sum becomes the profile's forward table at vLLM's CUDA-graph capture sizes (the
staircase) plus tail sizes, its context slope, prefill terms and draft tables.

Topologies (``Topology``; a node of ``gpus`` GPUs):
- ``tpN-epN``: attention tensor-parallel over N GPUs (query heads split, the single-head / latent
  KV cache replicated on every rank, as vLLM does for MLA), experts split over the same N GPUs;
  all-reduce after attention and after the MoE. One engine replica = N GPUs.
- ``dpN-epN``: attention data-parallel (each GPU an attention rank with its own requests and its
  own KV cache: one engine replica per GPU), experts split over the N GPUs, tokens exchanged by
  all-to-all dispatch/combine (DeepEP-style; DeepSeek-V3 report, Sec. 3.4, decodes this way).
  Assumption: the N ranks step in lockstep with similar batches (their MoE and all-to-all join
  every rank's tokens), so a rank with n tokens is priced as N x n tokens entering the experts.

Step of n tokens per GPU (every token priced as a decode/verify token with an LM-head row):
    F(n) = sum over ops of count x ms(op) + layers x graph gap (+ eager overhead above the
    capture limit); routed experts wait for the most loaded EP rank (``moe_lockstep_factor``:
    expected max over ranks of a roofline load proxy under uniform top-k routing, Monte Carlo
    with a fixed seed; the router's systematic skew is assumed removed by EPLB-style redundant
    experts).
Wide expert parallelism (EP = the routed experts, one expert per GPU, the DeepSeek-V3 report's
decode layout): a rank's experts are that expert's dense GEMMs (``Pricer._one_expert_ms``) and the
all-to-all runs over the inter-node network (``scope: inter_node`` records; dsim.profiling.deepep_tables).
Context: attention cores priced at two contexts give the KV slope (ms per 1000 KV tokens);
prefill chunks: the attention-core cost of one-chunk records beyond the decode-priced part, less
the LM-head rows they skip, is fitted as prefill_terms version 2 (``fit_prefill_terms``): pairs with
the cache and within the chunk, a signed per-token and a per-step term; for an executor with
step-wide key lists (step_keys) the chunk's own key lists at those terms' cell prices instead of
the pair terms.
"""

from __future__ import annotations

if __name__ == "__main__":  # a Ctrl-C while the modules below load: quiet exit 130
    from dsim.cli.toolmain import startup_guard

    startup_guard("dsim profile compose")

import argparse
import dataclasses
import datetime as _dt
import json
import sys
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dsim.cost import (
    BlockPool,
    BlockPoolKind,
    PrefillTerms,
    Profile,
    RequestAttention,
    Table,
    drafter_request_sizes,
    priced_from_q,
    save_profile,
    vllm_capture_sizes,
)
from dsim.errors import InputError
from dsim.profiling.attention_published import ATTENTION_KERNELS, PublishedAttention, attention_source
from dsim.profiling.kernel_tables import (
    HARDWARE,
    MATH_DTYPE,
    WEIGHT_BYTES,
    KernelTable,
    Roofline,
    carried_table,
    load_kernel_table,
)
from dsim.profiling.models import MoEModel, infer_model, load_model

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

KV_LO, KV_HI = 1024, 16384  # contexts the KV slope is measured between
SLOPE_BATCH = 64  # requests at which the slope is taken
PREFILL_Q = (256, 512, 1024, 2048, 8192)  # prompt-chunk lengths the prefill terms are fitted on
PREFILL_KV = (0, 512, 2048, 8192, 32768)  # cached context before the chunk
# drafter request counts: vLLM's CUDA-graph capture sizes (a drafter's batch is padded to the next
# one, as the target's), then coarser to 1024; the cost model reads the next size at or above
DRAFT_REQUESTS = tuple(drafter_request_sizes(512, 1024))
DRAFT_COLLECTED_REQUESTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
TAIL_TOKENS = (768, 1024, 1536, 2048, 4096, 8192, 16384)
# above the capture limit a step runs at its own token count and the table interpolates linearly:
# sizes every 128 tokens to 2048, 256 to 4096, 512 to 8192, 1024 to 16384 (the experts' row tiles and
# the mHC kernels change regime inside the coarse tail's gaps)
TAIL_SPACING = ((2048, 128), (4096, 256), (8192, 512), (16384, 1024))
# with the MoE in chunks, each chunk boundary b is a step in cost (a further chunk's dispatch, combine
# and expert weight reads start at b + 1, and most of its cost is paid by b + 64): sizes b, b + 1,
# b + 16, b + 64
CHUNK_OFFSETS = (0, 1, 16, 64)
GRAPH_GAP_US_PER_LAYER = 4.0  # gaps between kernels inside a CUDA graph, per layer (stated)
# above the capture limit a step runs without CUDA graphs (vLLM's dispatcher picks no graph for a batch
# above its largest capture size): what each layer adds then (stated for vLLM's compiled forward; our
# H200 shard executor, which issues about ten times a compiled layer's launches, measures 200-225 us
# per layer at 1,024-2,048 tokens per GPU, validator/gpu/moe_eager.py: an upper bound)
EAGER_US_PER_LAYER = 25.0
ACTIVATION_RESERVE_GB = 6.0  # activations, graphs, workspace per GPU (stated, vLLM-like)
MEM_UTIL = 0.9  # vLLM gpu_memory_utilization default
GPUS_PER_NODE = 8
# the per-request attention table (profile format 3): batch at vLLM's capture sizes to 512, the query
# tokens of decode / verify windows, contexts where the kernel tables hold attention series
REQ_BATCH_MAX = 512
REQ_Q = (1, 2, 4, 6, 8)
REQ_CTX = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
REQ_CTX_GRID = (512, 2048, 8192, 32768, 131072)  # of them, the kernel-op grid's contexts (KERNEL_OPS)
VLLM_MOE_DP_CHUNK = 256  # vLLM's VLLM_MOE_DP_CHUNK_SIZE default (tokens per DP rank per MoE chunk)


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


@dataclass(frozen=True)
class Op:
    """One kernel op of a step: ``record`` (the kernel-table key), ``part`` (which piece of the
    model it is, e.g. q_proj, attn_core, moe_experts), ``count`` (how many times per step)."""

    record: tuple
    part: str
    count: float

    @property
    def rec(self) -> dict:
        return dict(self.record)


def _op(part: str, count: float, **rec) -> Op:
    if rec.get("groups") == 1:  # one product: a plain GEMM record
        del rec["groups"]
    return Op(tuple(sorted(rec.items())), part, float(count))


def _dtypes(model: MoEModel, hardware: str) -> tuple[str, str]:
    """(dense GEMM dtype, expert dtype) as served on `hardware`: block-scaled FP8 for the dense
    weights (as released); FP4 experts natively on Blackwell, the FP8-expert variant on Hopper
    (no FP4 tensor cores there) unless the model was given w4a16 experts (4-bit weights, bf16
    math: Hopper's way to serve the FP4 checkpoint itself)."""
    expert = model.expert_dtype
    if expert == "fp4" and HARDWARE[hardware]["fp4"] is None:
        expert = "fp8"
    return "fp8", expert


def attn_record(model: MoEModel, topo: Topology, kind: str, phase: str, batch: int, q: int, kv: int) -> dict:
    heads = model.heads // topo.attn_tp
    r = dict(op="attn", kind=kind, phase=phase, batch=int(batch), q=int(q), kv=int(kv), heads=int(heads))
    return r


def layer_ops(
    model: MoEModel,
    topo: Topology,
    hardware: str,
    n: int,
    *,
    phase: str = "decode",
    batch: int | None = None,
    q: int = 1,
    kv: int = KV_LO,
    layers: Sequence[int] | None = None,
    moe_chunk: int = 0,
) -> list[Op]:
    """Ops of the decoder layers (all of them, or the indices in `layers`) for n tokens on one GPU.
    moe_chunk > 0 (data-parallel attention only): the MoE block (shared and routed experts,
    dispatch, combine) runs in chunks of at most that many tokens per rank, as vLLM's chunking MoE
    runner does with the DeepEP low-latency kernels (VLLM_MOE_DP_CHUNK_SIZE, default 256)."""
    dt, edt = _dtypes(model, hardware)
    tp = topo.attn_tp
    h = model.hidden
    B = batch if batch is not None else max(1, n // q)
    idx = range(model.layers) if layers is None else layers
    kinds: dict = {}
    moe_count = dense_count = 0
    for i in idx:
        kinds[model.attn_kinds[i]] = kinds.get(model.attn_kinds[i], 0) + 1
        if model.moe_layer[i]:
            moe_count += 1
        else:
            dense_count += 1
    L = sum(kinds.values())
    ops: list[Op] = []
    ops.append(_op("norms", L, op="elementwise", bytes=int(n * h * 2 * 2 * 2 * max(1, model.hc_mult // 2))))
    if model.family == "deepseek_v4":
        ops.append(_op("mhc", L, op="mhc", tokens=int(n), hidden=h, hc_mult=model.hc_mult))
        ops.append(_op("q_proj", L, op="gemm", dtype=dt, m=int(n), n=model.q_lora_rank, k=h))
        ops.append(
            _op("q_proj", L, op="gemm", dtype=dt, m=int(n), n=model.heads // tp * model.head_dim, k=model.q_lora_rank)
        )
        ops.append(_op("kv_proj", L, op="gemm", dtype=dt, m=int(n), n=model.head_dim, k=h))
        # grouped low-rank output projection (wo_a): og local groups, each [n, heads/o_groups x head_dim] x
        # [.., o_lora]; engines run it as one batched GEMM (DeepSeek's reference einsum "tgd,grd->tgr";
        # vLLM marks wo_a is_bmm over the local groups), then wo_b over the concatenated groups
        og = max(1, model.o_groups // tp)
        ops.append(
            _op(
                "o_proj",
                L,
                op="gemm",
                dtype=dt,
                m=int(n),
                n=model.o_lora_rank,
                k=model.heads * model.head_dim // model.o_groups,
                groups=og,
            )
        )
        ops.append(_op("o_proj", L, op="gemm", dtype=dt, m=int(n), n=h, k=og * model.o_lora_rank))
        # compressor: fused wkv + wgate, each coff x head_dim wide (coff = 2 at ratio 4, overlapping blocks;
        # 1 at ratio 128), bf16 weights in the released checkpoint (not FP8-quantized)
        for kind, coff in (("v4_csa", 2), ("v4_hca", 1)):
            if kinds.get(kind):
                ops.append(
                    _op("compressor", kinds[kind], op="gemm", dtype="bf16", m=int(n), n=2 * coff * model.head_dim, k=h)
                )
        if kinds.get("v4_csa"):
            c = kinds["v4_csa"]
            # lightning indexer: wq_b (q_lora -> index heads x index dim, FP8), the per-head weights
            # (hidden -> index heads, bf16) and its own ratio-4 compressor (hidden -> 2 x 2 x index dim, bf16)
            ops.append(
                _op(
                    "indexer_proj",
                    c,
                    op="gemm",
                    dtype=dt,
                    m=int(n),
                    n=model.index_heads * model.index_dim,
                    k=model.q_lora_rank,
                )
            )
            ops.append(_op("indexer_proj", c, op="gemm", dtype="bf16", m=int(n), n=model.index_heads, k=h))
            ops.append(_op("indexer_proj", c, op="gemm", dtype="bf16", m=int(n), n=4 * model.index_dim, k=h))
    else:
        hl = model.heads // tp
        ops.append(_op("q_proj", L, op="gemm", dtype=dt, m=int(n), n=model.q_lora_rank, k=h))
        ops.append(_op("q_proj", L, op="gemm", dtype=dt, m=int(n), n=hl * model.head_dim, k=model.q_lora_rank))
        ops.append(_op("kv_proj", L, op="gemm", dtype=dt, m=int(n), n=model.kv_lora_rank + model.rope_dim, k=h))
        # absorbed MLA: q_nope x W_UK and the latent output x W_UV per local head, one batched GEMM each
        # (vLLM's MLA backends run torch.bmm over the heads: hl products of m = n tokens, all heads' weights)
        ops.append(
            _op("mla_absorb", L, op="gemm", dtype="bf16", m=int(n), n=model.kv_lora_rank, k=model.nope_dim, groups=hl)
        )
        ops.append(
            _op("mla_absorb", L, op="gemm", dtype="bf16", m=int(n), n=model.v_head_dim, k=model.kv_lora_rank, groups=hl)
        )
        ops.append(_op("o_proj", L, op="gemm", dtype=dt, m=int(n), n=h, k=hl * model.v_head_dim))
    for kind, c in kinds.items():
        ops.append(_op("attn_core", c, **attn_record(model, topo, kind, phase, B, q, kv)))
    if tp > 1:
        ops.append(_op("comm", L, op="comm", kind="all_reduce", gpus=tp, bytes=int(n * h * 2)))
    if dense_count:
        ops.append(_op("dense_mlp", dense_count, op="gemm", dtype=dt, m=int(n), n=2 * model.dense_inter // tp, k=h))
        ops.append(_op("dense_mlp", dense_count, op="gemm", dtype=dt, m=int(n), n=h, k=model.dense_inter // tp))
    if moe_count:
        learned = moe_count - (
            min(model.hash_layers, moe_count) if layers is None else sum(1 for i in idx if i < model.hash_layers)
        )
        if learned:
            ops.append(_op("router", learned, op="gemm", dtype="bf16", m=int(n), n=model.experts, k=h))
        C = int(moe_chunk) if topo.attn_dp > 1 and moe_chunk and n > moe_chunk else 0
        pieces = [(n, 1)] if not C else [(C, n // C)] + ([(n % C, 1)] if n % C else [])
        for m_tok, times in pieces:
            ops += _moe_block_ops(model, topo, dt, edt, m_tok, moe_count * times)
    return ops


@cache
def _included_parts(kind: str, heads: int, phase: str, batch: int, q: int, kv: int, includes: tuple) -> tuple:
    name = infer_model(kind, heads)
    if name is None:
        return ()
    m = load_model(name)
    if kind not in m.attn_kinds or m.heads % heads:
        return ()
    tp = m.heads // heads
    topo = Topology(f"tp{tp}-ep{tp}", tp, 1, tp)
    layer = m.attn_kinds.index(kind)
    ops = layer_ops(m, topo, "h200", batch * q, phase=phase, batch=batch, q=q, kv=kv, layers=[layer])
    return tuple(op.record for op in ops if op.part in includes)


def included_part_records(rec: dict) -> list[dict]:
    """The op records of the layer parts an attention-module record includes (its ``includes``: the
    projections, V4's compressor and indexer projections), for the shipped model the record belongs to
    (dsim.profiling.models.infer_model: kind and heads per GPU) at its batch x q tokens; [] where unknown."""
    if rec.get("op") != "attn" or not rec.get("includes"):
        return []
    key = (rec["kind"], int(rec["heads"]), rec["phase"], int(rec["batch"]), int(rec["q"]), int(rec["kv"]))
    return [dict(r) for r in _included_parts(*key, tuple(sorted(rec["includes"])))]


def load_table_spec(spec: str) -> KernelTable:
    """A kernel table by name or path, or ``NAME@HW``: that table carried to hardware HW
    (dsim.profiling.kernel_tables.carried_table, an attention module's included projections priced with it), from the
    hardware its name starts with (h200-aic-vllm@h800: AIC's H200 vLLM table on an H800)."""
    name, at, hw = spec.rpartition("@")
    if not at or "/" in hw or hw.endswith((".json", ".gz")):  # a plain name or path (a path may hold an @)
        return load_kernel_table(spec)
    src = Path(name).name.split("-")[0].lower()
    if src not in HARDWARE or hw.lower() not in HARDWARE:
        raise InputError(
            f"{spec!r}: NAME@HW needs a table named <hardware>-... and HW one of {', '.join(sorted(HARDWARE))}"
        )
    return _carried(name, src, hw.lower())


@lru_cache(maxsize=8)
def _carried(name: str, src: str, hw: str) -> KernelTable:
    # (a table is read-only once built: one carry per table and GPU in a process)
    return carried_table(load_kernel_table(name), src, hw, included_part_records)


def physical_experts(model: MoEModel, topo: Topology) -> int:
    """The routed experts an EP group holds: the model's, or where they do not divide over the EP
    ranks, the fewest redundant copies that give every rank the same count (DeepSeek's decode layout:
    EP144, 256 experts + 32 redundant, 2 per GPU; the inference-system overview, open-infra-index).
    The copies go to the most loaded experts (EPLB), so routing stays uniform over the copies."""
    e, ep = model.experts, topo.ep
    return e if e % ep == 0 else -(-e // ep) * ep


def _moe_block_ops(model: MoEModel, topo: Topology, dt: str, edt: str, n: int, count: float) -> list[Op]:
    """The MoE block of `count` layer passes over n tokens per rank: shared expert, the routed
    experts of the EP group's tokens (n x DP ranks), dispatch / combine or the TP all-reduce."""
    h, tp = model.hidden, topo.attn_tp
    ops: list[Op] = []
    if model.shared_experts:
        si = model.shared_experts * model.moe_inter // tp
        ops.append(_op("shared_expert", count, op="gemm", dtype=dt, m=int(n), n=2 * si, k=h))
        ops.append(_op("shared_expert", count, op="gemm", dtype=dt, m=int(n), n=h, k=si))
    T = n * topo.attn_dp
    ops.append(
        _op(
            "moe_experts",
            count,
            op="moe",
            dtype=edt,
            tokens=int(T),
            hidden=h,
            inter=model.moe_inter,
            topk=model.topk,
            experts=physical_experts(model, topo),
            ep=topo.ep,
        )
    )
    if topo.attn_dp > 1:
        scope: dict = {"scope": "inter_node"} if topo.nodes > 1 else {}
        scope.update(hidden=h, topk=model.topk, experts=model.experts)  # the shape the message carries
        ops.append(_op("comm", count, op="comm", kind="a2a_dispatch", gpus=topo.ep, bytes=int(n * h * 1), **scope))
        ops.append(_op("comm", count, op="comm", kind="a2a_combine", gpus=topo.ep, bytes=int(n * h * 2), **scope))
    elif tp > 1:
        ops.append(_op("comm", count, op="comm", kind="all_reduce", gpus=tp, bytes=int(n * h * 2)))
    return ops


def step_ops(model: MoEModel, topo: Topology, hardware: str, n: int, **kw: Any) -> list[Op]:
    """All ops of one target forward of n tokens on one GPU: embedding, the decoder layers, the
    final norm and the LM head (vocabulary split over the TP ranks, logits gathered)."""
    ops = [_op("embedding", 1, op="elementwise", bytes=int(n * model.hidden * 2 * 2))]
    ops += layer_ops(model, topo, hardware, n, **kw)
    ops.append(_op("lm_head", 1, op="gemm", dtype="bf16", m=int(n), n=model.vocab // topo.attn_tp, k=model.hidden))
    if topo.attn_tp > 1:
        ops.append(
            _op(
                "comm",
                1,
                op="comm",
                kind="all_gather",
                gpus=topo.attn_tp,
                bytes=int(n * model.vocab // topo.attn_tp * 4),
            )
        )
    return ops


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
        ops.append(_op("mtp_proj", 1, op="gemm", dtype="fp8", m=int(R), n=model.hidden, k=2 * model.hidden))
        ops.append(_op("lm_head", 1, op="gemm", dtype="bf16", m=int(R), n=model.vocab // topo.attn_tp, k=model.hidden))
        return ops
    n = R * block
    swa = [i for i, k in enumerate(model.attn_kinds) if k in ("v4_swa", "mla")][:1] or [last]
    ops = []
    batch, q = (n, 1) if flat_attention else (R, block)
    for _ in range(3):
        ops += layer_ops(model, topo, hardware, n, layers=swa, batch=batch, q=q, moe_chunk=moe_chunk)
    ops.append(_op("lm_head", 1, op="gemm", dtype="bf16", m=int(n), n=model.vocab // topo.attn_tp, k=model.hidden))
    return ops


# ---------------------------------------------------------------------------------------- pricing
class Pricer:
    """Prices ops from kernel tables in order of preference (the first that answers), falling back
    to the roofline; counts what each source priced. `zero_ops`: op kinds priced at 0 (a one-GPU
    shard check excludes communication). Parts that the preferred attention table's records
    include (e.g. projections inside an attention module) are not priced again."""

    def __init__(
        self,
        table: KernelTable | list[KernelTable] | None,
        roofline: Roofline,
        zero_ops: frozenset = frozenset(),
        prefer: dict | None = None,
        attention: PublishedAttention | None = None,
    ):
        self.tables = [t for t in (table if isinstance(table, list) else [table]) if t is not None]
        # attention: a source asked first for attention cores (FlashMLA's published rates); the
        # projections an attention-module table includes are then priced as their own GEMMs
        self.attention = attention
        # prefer: op kind -> table name asked first for that kind (e.g. mhc from an engine's table)
        self.order = {
            op: [t for t in self.tables if t.name == name] + [t for t in self.tables if t.name != name]
            for op, name in (prefer or {}).items()
        }
        for op, name in (prefer or {}).items():
            if name not in {t.name for t in self.tables}:
                raise InputError(f"--prefer {op}={name}: {name} is not one of the kernel tables given")
        self.table = self.tables[0] if self.tables else None
        self.roofline = roofline
        self.zero_ops = set(zero_ops)
        attn_table = next((t for t in self.tables if any(r["op"] == "attn" for r in t.records)), None)
        self.skip = attn_table.includes("attn") | attn_table.includes("moe") if attn_table else set()
        if attention is not None and attn_table is not None:
            self.skip = attn_table.includes("moe")
        self.priced: dict = {}
        self.fallback: dict = {}
        self.by_table: dict = {}
        self.grouped_as_single: dict = {}
        self.moe_as_gemm = 0  # moe lookups priced as one expert's GEMMs (_one_expert_ms)

    def ms(self, op: Op) -> float:
        if op.part in self.skip:
            return 0.0
        rec = op.rec
        if rec["op"] in self.zero_ops:
            return 0.0
        if self.attention is not None and rec["op"] == "attn":
            return self._attention_ms(rec)
        return self._rec_ms(rec)

    def _attention_ms(self, rec: dict) -> float:
        """An attention core with an attention source given: the source's price where it has one; else
        the tables' (an attention-module record less the parts it includes, priced as the composer
        prices them when they run as their own ops: the module's total is unchanged)."""
        assert self.attention is not None
        v = self.attention.ms(rec)
        if v is not None:
            self.by_table[self.attention.name] = self.by_table.get(self.attention.name, 0) + 1
            self.priced["attn"] = self.priced.get("attn", 0) + 1
            return float(v)
        t = self._rec_ms(rec)
        parts = included_part_records({**rec, "includes": self._table_includes(rec)})
        return max(0.0, t - sum(self._rec_ms(p) for p in parts))

    def _table_includes(self, rec: dict) -> list:
        """The parts the table record answering `rec` includes (those of the first table that answers)."""
        for tb in self.order.get(rec["op"], self.tables):
            if tb.ms(rec) is not None:
                return sorted(tb.includes(rec["op"]))
        return []

    def _rec_ms(self, rec: dict) -> float:
        v = self._lookup(rec)
        if v is None and rec["op"] == "gemm" and rec.get("groups", 1) > 1:
            # a table without batched-GEMM records: the single GEMM of the same FLOPs, weight and
            # activation bytes in one launch ([m, groups x k] x [groups x k, n]; only its output is
            # groups times smaller)
            eq = {k: v for k, v in rec.items() if k != "groups"}
            eq["k"] = int(rec["k"]) * int(rec["groups"])
            v = self._lookup(eq)
            if v is not None:
                self.grouped_as_single[rec["op"]] = self.grouped_as_single.get(rec["op"], 0) + 1
        if v is None and rec["op"] == "moe":
            v = self._one_expert_ms(rec)
        bucket = self.priced if v is not None else self.fallback
        bucket[rec["op"]] = bucket.get(rec["op"], 0) + 1
        if v is None:
            v = self.roofline.ms(rec)
        return float(v)

    def _one_expert_ms(self, rec: dict) -> float | None:
        """The routed experts of an EP rank holding ONE expert (EP = the routed experts; DeepSeek-V3
        report Sec. 3.4: in decoding each GPU hosts one routed expert) where no table has a moe record
        for the group: that expert's FFN is a dense gate+up GEMM [rows, hidden] x [hidden, 2 inter] and
        a down GEMM [rows, inter] x [inter, hidden] (the shapes of one shared expert), priced from the
        tables' GEMM records (the moe op's preferred table first), plus its SwiGLU, routing-weight and
        permute traffic as elementwise bytes. rows = tokens x topk / experts, the mean rank's (the
        lockstep factor adds the slowest rank's excess). A rank of several experts (E / P of them, wide EP:
        2 on DeepSeek's EP144) runs that pair once per expert its tokens reach (the mean number under
        uniform routing), as kernels_aic.moe_as_gemms re-prices AIC's rows per GPU. None where the experts do not divide over the ranks or a GEMM has no record."""
        T, H, inter, k, E, P = (int(rec[x]) for x in ("tokens", "hidden", "inter", "topk", "experts", "ep"))
        if E % P:
            return None
        # a rank of several experts runs those its tokens reach: the mean of them under uniform routing
        # (the lockstep factor adds the slowest rank's excess); one expert always runs (the slowest rank)
        local: float = E // P
        if local > 1:
            local = max(1.0, local * (1.0 - (1.0 - k / E) ** T))
        rows = max(1, round(T * k / (local * P)))
        order = self.order.get("moe", self.tables)
        parts = []
        for n_, k_ in ((2 * inter, H), (H, inter)):
            g = dict(op="gemm", dtype=rec["dtype"], m=rows, n=n_, k=k_)
            v = next((x for x in (t.ms(g) for t in order) if x is not None), None)
            if v is None:
                return None
            parts.append(v)
        ew = dict(op="elementwise", bytes=int(local * rows * (2 * inter * 2 + inter * 2 + 4 * H * 2)))
        v_ew = next((x for x in (t.ms(ew) for t in self.tables) if x is not None), None)
        self.moe_as_gemm += 1
        return float(local * sum(parts) + (v_ew if v_ew is not None else self.roofline.ms(ew)))

    def _lookup(self, rec: dict) -> float | None:
        for t in self.order.get(rec["op"], self.tables):
            v = t.ms(rec)
            if v is not None:
                self.by_table[t.name] = self.by_table.get(t.name, 0) + 1
                return v
        return None

    def total(self, ops: list[Op]) -> float:
        return sum(op.count * self.ms(op) for op in ops)


@dataclass(frozen=True)
class LayerGlue:
    """What a layer costs beyond the sum of its priced kernels (activation quantization, small
    norms and elementwise kernels, launch gaps): a + b x tokens per layer, fitted on whole-layer
    measurements ("layer" records of our shard executor) against the composer's own sum."""

    a_ms: float = 0.0
    b_ms_per_tok: float = 0.0
    fit: dict | None = None

    def ms(self, n: float) -> float:
        return self.a_ms + self.b_ms_per_tok * n


def composed_layer_ms(model: MoEModel, topo: Topology, hardware: str, rec: dict, pricer: Pricer) -> float:
    """The composer's sum for one decoder layer of a measured "layer" record's kind and shape."""
    kind = rec.get("attn_kind")
    # V3's layers are MLA with a dense MLP (mla_dense, the first layers) or with MoE (mla_moe)
    idx = [
        i
        for i, k in enumerate(model.attn_kinds)
        if (k == kind and kind != "mla")
        or (kind == "mla_dense" and not model.moe_layer[i])
        or (kind in ("mla", "mla_moe") and k == "mla" and model.moe_layer[i])
    ]
    if not idx:
        raise InputError(f"layer record: no layer of kind {kind!r} in {model.name}")
    q, B = int(rec["q"]), int(rec["batch"])
    phase = "prefill" if q >= 256 else "decode"
    ops = layer_ops(model, topo, hardware, B * q, phase=phase, batch=B, q=q, kv=int(rec["kv"]), layers=[idx[0]])
    ops = [o for o in ops if o.part != "comm"]
    return priced_total(model, topo, hardware, ops, pricer) + GRAPH_GAP_US_PER_LAYER * 1e-3


def fit_layer_glue(
    model: MoEModel, topo: Topology, hardware: str, pricer: Pricer, records: list[dict], source: str = ""
) -> LayerGlue:
    """Least squares a + b x tokens on the measured-minus-composed residual of every other layer
    record (even positions: fit); the odd positions are the check, reported with the fit."""
    rows = [
        r for r in records if r.get("op") == "layer" and r.get("model") == model.name and r.get("topology") == topo.name
    ]
    if len(rows) < 4:
        raise InputError(
            f"{source or 'layer records'}: {len(rows)} layer records for {model.name} {topo.name} "
            "(at least 4 needed to fit and check)"
        )
    comp = np.array([composed_layer_ms(model, topo, hardware, r, pricer) for r in rows])
    meas = np.array([float(r["ms"]) for r in rows])
    tok = np.array([float(r["batch"]) * float(r["q"]) for r in rows])
    fit_i, chk_i = np.arange(0, len(rows), 2), np.arange(1, len(rows), 2)
    A = np.stack([np.ones(len(fit_i)), tok[fit_i]], axis=1)
    (a, b), *_ = np.linalg.lstsq(A, meas[fit_i] - comp[fit_i], rcond=None)
    a, b = max(float(a), 0.0), max(float(b), 0.0)

    def err(ix: np.ndarray, with_glue: bool) -> np.ndarray:
        pred = comp[ix] + (a + b * tok[ix] if with_glue else 0.0)
        return np.abs(pred / meas[ix] - 1.0) * 100

    fit = dict(
        source=source,
        records=len(rows),
        fit_records=len(fit_i),
        check_records=len(chk_i),
        a_ms=round(a, 5),
        b_ms_per_ktok=round(b * 1000, 5),
        check_median_abs_pct_without=round(float(np.median(err(chk_i, False))), 2),
        check_median_abs_pct=round(float(np.median(err(chk_i, True))), 2),
        check_p90_abs_pct=round(float(np.percentile(err(chk_i, True), 90)), 2),
        fit_median_abs_pct=round(float(np.median(err(fit_i, True))), 2),
    )
    if np.median(err(chk_i, True)) >= np.median(err(chk_i, False)):
        # the glue does not improve the held-out records: not applied
        fit.update(applied=False, a_ms=0.0, b_ms_per_ktok=0.0)
        return LayerGlue(0.0, 0.0, fit)
    fit["applied"] = True
    return LayerGlue(a, b, fit)


LOCKSTEP_SAMPLED_TOKENS = 16384
"""Group tokens up to which moe_lockstep_factor samples each token's experts; above, it draws the
per-expert counts directly (the same with-replacement law, O(experts) a trial). The slowest rank's
excess shrinks as 1/sqrt(rows): clamping the group at this size, as before, overstated it at EP256
from 64 tokens per rank on (1.15 for 1.07 at 256 tokens per rank)."""


@lru_cache(maxsize=4096)
def moe_lockstep_factor(
    tokens: int, topk: int, experts: int, ep: int, expert_bytes: float, row_flop_s: float, bw: float, trials: int = 64
) -> float:
    """E[max over EP ranks] / E[one rank] of a rank's expert time proxy under uniform top-k routing:
    max(distinct local experts x expert bytes / BW, rows x FLOPs per row / peak). A step waits for
    its slowest rank; at small batches the experts touched differ from rank to rank. Monte Carlo,
    fixed seed (deterministic); each token's k experts distinct."""
    if ep <= 1 or tokens <= 0:
        return 1.0
    rng = np.random.default_rng(12345 + tokens)
    local = experts // ep
    mx = mean = 0.0
    for _ in range(trials):
        if tokens <= 256:  # exact: k distinct experts per token
            choice = np.argpartition(rng.random((tokens, experts)), topk, axis=1)[:, :topk]
            counts = np.bincount(choice.ravel(), minlength=experts)
        elif tokens <= LOCKSTEP_SAMPLED_TOKENS:  # with replacement (the difference is k/E per token)
            choice = rng.integers(0, experts, size=(tokens, topk))
            counts = np.bincount(choice.ravel(), minlength=experts)
        else:  # the same law drawn as its counts: a multinomial of tokens x k over the experts
            counts = rng.multinomial(tokens * topk, np.full(experts, 1.0 / experts))
        counts = counts.reshape(ep, local)
        active = (counts > 0).sum(axis=1)
        rows = counts.sum(axis=1)
        proxy = np.maximum(active * expert_bytes / bw, rows * row_flop_s)
        mx += proxy.max()
        mean += proxy.mean()
    return float(mx / mean) if mean > 0 else 1.0


def _moe_factor(model: MoEModel, topo: Topology, hardware: str, op: Op, roof: Roofline) -> float:
    r = op.rec
    hw = HARDWARE[hardware]
    wb = WEIGHT_BYTES.get(r["dtype"], 2.0)
    peak = {"fp4": hw["fp4"] or hw["fp8"], "fp8": hw["fp8"]}.get(MATH_DTYPE.get(r["dtype"], "bf16"), hw["bf16"])
    T = int(r["tokens"])
    return moe_lockstep_factor(
        T,
        model.topk,
        physical_experts(model, topo),
        topo.ep,
        3.0 * model.hidden * model.moe_inter * wb,
        2.0 * 3 * model.hidden * model.moe_inter / (peak * roof.eff_flops),
        hw["bw"] * roof.eff_bw,
    )


def priced_total(model: MoEModel, topo: Topology, hardware: str, ops: Iterable[Op], pricer: Pricer) -> float:
    t = 0.0
    for op in ops:
        v = op.count * pricer.ms(op)
        if op.part == "moe_experts":
            v *= _moe_factor(model, topo, hardware, op, pricer.roofline)
        t += v
    return t


def forward_ms(
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
    moe_chunk: int = 0,
    eager_us: float = EAGER_US_PER_LAYER,
) -> float:
    """One target forward of n tokens, as ceil(n / q) requests of q query tokens each at kv context;
    above the capture limit each layer adds eager_us (the step runs without CUDA graphs)."""
    qq = max(1, min(int(q), int(n)))
    ops = step_ops(model, topo, hardware, n, kv=kv, q=qq, batch=-(-int(n) // qq), moe_chunk=moe_chunk)
    t = priced_total(model, topo, hardware, ops, pricer)
    t += model.layers * (GRAPH_GAP_US_PER_LAYER * 1e-3 + glue.ms(n))
    if n > limit:
        t += model.layers * eager_us * 1e-3
    return t


# ---------------------------------------------------------------------------------------- two-batch overlap
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


def _attn_only(model, topo, hardware, pricer, *, phase, batch, q, kv) -> float:
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
                [_attn_only(model, topo, hardware, tp, phase="decode", batch=B, q=q, kv=c) for c in REQ_CTX]
                for q in REQ_Q
            ]
            for B in batch
        ]
    )
    share = []
    for n in tokens:
        qq = max(1, min(int(forward_q), int(n)))
        B = -(-int(n) // qq)
        a = _attn_only(model, topo, hardware, pricer, phase="decode", batch=B, q=qq, kv=KV_LO)
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
                    _attn_only(model, topo, hardware, pricer, phase="decode", batch=base, q=1, kv=int(ctx)) * n / base
                )
    return dataclasses.replace(
        ra,
        step_ms=tab,
        source=ra.source + "; verify windows of q tokens priced as q one-token decodes at the request's context",
    )


STEP_INDEXER_Q = (512, 2048, 8192)  # prompt-chunk tokens whose indexer slope prices a logits cell
STEP_INDEXER_KV = (32768, 131072)  # contexts the slope is taken between (top-k saturated: key lists fixed)


def step_indexer_ms_per_mcell(model: MoEModel, topo: Topology, hardware: str, pricer: Pricer) -> float:
    """ms per million lightning-indexer logits cells (token x compressed key), all csa layers: the
    growth of the csa attention core with context between STEP_INDEXER_KV, where the top-k is
    saturated and the attended key lists stay fixed, so only the indexer's logits and their top-k
    grow; taken on prompt chunks (thousands of tokens, the rows a longest-context indexer widens
    most), the median over STEP_INDEXER_Q. Format 4 step_indexer (dsim.cost module doc)."""
    ratio = 4
    n_csa = sum(1 for r in model.compress_ratios[: model.layers] if r == ratio)
    lo, hi = STEP_INDEXER_KV
    slopes = []
    for qn in STEP_INDEXER_Q:
        t = [
            pricer.ms(_op("attn_core", 1, **attn_record(model, topo, "v4_csa", "prefill", 1, qn, kv)))
            for kv in (lo, hi)
        ]
        slopes.append(max(0.0, (t[1] - t[0]) / (qn * (hi - lo) / ratio / 1e6)))
    return n_csa * float(np.median(slopes))


#: the V4 attention kinds an executor's step_keys term prices: (compression ratio, key cap source)
_STEP_KEY_KINDS = ("v4_csa", "v4_hca", "v4_swa")
#: contexts (q = 1) between which a kind's key lists grow at a large batch (no split): csa 128 -> 512
#: selected entries (top-k filling), hca 64 -> 512 compressed entries
STEP_KEYS_KV = {"v4_csa": (512, 2048), "v4_hca": (8192, 65536)}


def _executor_split_rule(table: KernelTable, model: MoEModel) -> tuple[int, int, int]:
    """(programs, block, min_chunk) of our shard executor's split-K rule (validator/gpu/moe_ops.py
    plan_work) from the kernel table's recorded launch tuning: key lists are split when the step's
    row blocks x value blocks fill fewer than 2 programs per SM, into chunks of
    max(2 x block_n, ceil(N k / programs / block_n) x block_n) keys."""
    gpu = table.provenance.get("gpu") or {}
    tune = (gpu.get("tune") or {}).get("attn")
    if not tune or not gpu.get("sms"):
        raise InputError(
            f"--step-keys: kernel table {table.name} records no attention launch tuning (provenance.gpu.tune.attn, sms)"
        )
    dvb = max(1, model.head_dim // min(int(tune["block_dv"]), model.head_dim))
    return -(-2 * int(gpu["sms"]) // dvb), int(tune["block_n"]), 2 * int(tune["block_n"])


def _key_width(model: MoEModel, kind: str, ctx_plus_q: int) -> int:
    """Entries a token of `kind` selects beyond its window, over ctx + q tokens (format 4 step_keys)."""
    if kind == "v4_csa":
        return min(model.index_topk, ctx_plus_q // 4)
    if kind == "v4_hca":
        return ctx_plus_q // 128
    return 0


def _record_work(model: MoEModel, rec: dict, rule: tuple[int, int, int]) -> int:
    """Split-K work items of one decode attention-core record (B equal requests of q tokens over kv)
    as our shard executor runs it (0: not split)."""
    from dsim.cost import split_work

    k = model.sliding_window + _key_width(model, rec["kind"], int(rec["kv"]) + int(rec["q"]))
    return int(split_work(int(rec["batch"]) * int(rec["q"]), k, *rule))


def split_combine_ms_per_work(model: MoEModel, topo: Topology, table: KernelTable, rule: tuple[int, int, int]) -> float:
    """ms per split-K work item of the executor's logsumexp combine, from the table's own decode
    attention-core records: adjacent contexts of one (kind, batch, q) series, one split and one
    not, whose key lists differ by under 10 %: (split - unsplit) / the split's work items, the
    median over such pairs."""
    heads = model.heads // topo.attn_tp
    series: dict = {}
    for r in table.records:
        if r["op"] == "attn" and r.get("phase") == "decode" and r.get("kind") in _STEP_KEY_KINDS:
            if r.get("heads") == heads:
                series.setdefault((r["kind"], r["batch"], r["q"]), []).append(r)
    vals = []
    for (kind, _, q), rs in series.items():
        rs.sort(key=lambda r: r["kv"])
        for a, b in zip(rs, rs[1:]):
            wa, wb = _record_work(model, a, rule), _record_work(model, b, rule)
            if bool(wa) == bool(wb):
                continue
            ka, kb = (model.sliding_window + _key_width(model, kind, int(r["kv"]) + q) for r in (a, b))
            if abs(ka - kb) > 0.1 * min(ka, kb):
                continue
            sp, un = (a, b) if wa else (b, a)
            vals.append((float(sp["ms"]) - float(un["ms"])) / max(wa, wb))
    if not vals:
        raise InputError(
            f"--step-keys: kernel table {table.name} has no pair of adjacent-context attention records, one split "
            f"and one not, at {heads} heads (needed for the split-K combine's cost)"
        )
    return max(0.0, float(np.median(vals)))


def without_split_combine(table: KernelTable, model: MoEModel, topo: Topology, rule, per_work: float) -> KernelTable:
    """The table with each decode V4 attention-core record's split-K combine (per_work x its work
    items, as the executor runs the record's shape) taken out: the per-request table of a step_keys
    profile is priced from these, the step's own combine added by the cost model."""
    heads = model.heads // topo.attn_tp
    recs = []
    for r in table.records:
        if r["op"] == "attn" and r.get("phase") == "decode" and r.get("kind") in _STEP_KEY_KINDS:
            if r.get("heads") == heads:
                w = _record_work(model, r, rule)
                if w:
                    r = dict(r, ms=max(1e-4, float(r["ms"]) - per_work * w))
        recs.append(r)
    return KernelTable(table.name, table.provenance, recs, table.source_path)


def step_keys_term(model: MoEModel, topo: Topology, hardware: str, pricer: Pricer, indexer_ms_per_mcell: float):
    """The format-4 step_keys term of our shard executor (dsim.cost module doc): the split-K rule
    from the table's launch tuning, the combine per work item and each kind's ms per padded key
    cell from the table's attention-core records: the decode core's growth between STEP_KEYS_KV
    at the largest batch (one query token each, not split) per key cell, less the csa indexer's
    own growth (indexer_ms_per_mcell, all csa layers) over the same cells."""
    from dsim.cost import StepKeyKind, StepKeys

    table = pricer.table
    if table is None or model.family != "deepseek_v4":
        raise InputError("--step-keys: needs a kernel table and a V4 model")
    rule = _executor_split_rule(table, model)
    per_work = split_combine_ms_per_work(model, topo, table, rule)
    n_kind = {k: sum(1 for a in model.attn_kinds if a == k) for k in _STEP_KEY_KINDS}
    big = max(vllm_capture_sizes(REQ_BATCH_MAX))
    if big < rule[0]:
        raise InputError(f"--step-keys: the largest batch {big} splits its key lists (fewer than {rule[0]} tokens)")
    kinds = []
    for kind in _STEP_KEY_KINDS:
        if not n_kind[kind]:
            continue
        coef = 0.0
        if kind in STEP_KEYS_KV:
            lo, hi = STEP_KEYS_KV[kind]
            t = [
                pricer.ms(_op("attn_core", 1, **attn_record(model, topo, kind, "decode", big, 1, kv)))
                for kv in (lo, hi)
            ]
            cells = big * (_key_width(model, kind, hi + 1) - _key_width(model, kind, lo + 1)) / 1e6
            idx = 0.0
            if kind == "v4_csa" and n_kind[kind]:
                idx = indexer_ms_per_mcell / n_kind[kind] * big * ((hi + 1) // 4 - (lo + 1) // 4) / 1e6
            coef = n_kind[kind] * max(0.0, (t[1] - t[0] - idx) / cells)
        kinds.append(
            StepKeyKind(
                layers=n_kind[kind],
                ratio={"v4_csa": 4, "v4_hca": 128}.get(kind, 0),
                cap=model.index_topk if kind == "v4_csa" else 0,
                window=model.sliding_window,
                ms_per_mcell=round(coef, 6),
            )
        )
    return StepKeys(rule[0], rule[1], rule[2], round(per_work, 8), tuple(kinds)), rule


def kv_capacity(model: MoEModel, topo: Topology, hardware: str, max_num_seqs: int) -> tuple[float, dict]:
    """(KV-cache GiB per replica, memory breakdown per GPU in GB). Weights per GPU: attention and
    embeddings replicated per DP rank (split over TP ranks), experts split over EP ranks; the
    sliding windows of max_num_seqs requests reserved."""
    pb = model.param_bytes()
    hw = HARDWARE[hardware]
    # param_bytes counts experts as released (fp4: 0.53 B); rescale to the dtype actually served
    released = WEIGHT_BYTES["fp4"] if model.expert_dtype in ("fp4", "w4a16") else WEIGHT_BYTES["fp8"]
    e_scale = WEIGHT_BYTES[_dtypes(model, hardware)[1]] / released
    per_gpu = dict(
        attention=pb["attention"] / topo.attn_tp,
        dense_and_shared=pb["shared_and_dense"] / topo.attn_tp,
        router=pb["router"],
        embeddings=pb["embeddings"] / topo.attn_tp,
        routed_experts=pb["routed_experts"] * e_scale * physical_experts(model, topo) / model.experts / topo.ep,
        mtp=pb["mtp"] / topo.ep,
    )
    weights_gb = sum(per_gpu.values()) / 1e9
    windows_gb = max_num_seqs * model.kv_bytes_per_request() / 1e9
    free_gb = hw["hbm_gb"] * MEM_UTIL - weights_gb - ACTIVATION_RESERVE_GB - windows_gb
    mem = {k: round(v / 1e9, 2) for k, v in per_gpu.items()}
    mem.update(
        weights_total=round(weights_gb, 2),
        activation_reserve=ACTIVATION_RESERVE_GB,
        sliding_windows=round(windows_gb, 2),
        kv_cache=round(free_gb, 2),
    )
    if free_gb <= 1.0:
        raise InputError(
            f"{model.name}: weights ({weights_gb:.0f} GB per GPU) leave no KV cache on "
            f"{topo.name} x {hw['name']} ({hw['hbm_gb']:.0f} GB); use more GPUs (e.g. dp16-ep16) or FP4 experts"
        )
    return free_gb * 1e9 / 2**30, mem


def compose_profile(
    model: MoEModel,
    topo: Topology,
    hardware: str,
    table: KernelTable | list[KernelTable] | None = None,
    *,
    name: str | None = None,
    max_capture: int | None = None,
    draft_block: int = 7,
    max_num_seqs: int = 1024,
    cpu_overhead_ms: float = 2.0,
    roofline: Roofline | None = None,
    table_error: dict | None = None,
    command: str = "",
    zero_ops: frozenset = frozenset(),
    layer_records: list[dict] | None = None,
    layer_source: str = "",
    prefer: dict | None = None,
    forward_q: int = 1,
    moe_dp_chunk: int | None = None,
    request_attention: bool = True,
    overlap: str = "none",
    dbo_threshold: int | str = DBO_DECODE_TOKEN_THRESHOLD,
    step_indexer: bool = False,
    step_keys: bool = False,
    verify_attention: str = "window",
    eager_us_per_layer: float = EAGER_US_PER_LAYER,
    block_pool: dict | None = None,
    attention_kernels: str | None = None,
) -> Profile:
    """Build the profile (see the module doc). `table`: one kernel table or several in order of
    preference. `table_error`: the measured error of the (first) table against our own
    measurements on comparable hardware, carried into provenance. `zero_ops`: op kinds priced at
    0 (e.g. comm, for a one-GPU shard check). `layer_records`: whole-layer measurements the
    per-layer glue is fitted on (see LayerGlue). `moe_dp_chunk`: tokens per rank per MoE chunk on
    data-parallel topologies (None: vLLM's default, 256; 0: one pass, as our shard executor runs).
    `request_attention`: add the format-3 per-request attention table (dsim.cost module doc).
    `verify_attention`: "window" (the kernel tables' q-token records) or "tokens" (each verify token
    as a one-token decode, flattened_verify_attention). `step_indexer`: price V4's lightning
    indexer as our shard executor runs it, every token of the step scored over the step's longest context (format 4; vLLM's kernels score each request over
    its own context, so engine profiles leave it out). `step_keys`: price the V4 attention cores'
    key lists as our shard executor runs them, every token's as long as the step's longest, split
    by the step's own tokens (format 4 step_keys; needs step_indexer). `eager_us_per_layer`: what each
    layer adds to a step above the capture limit, run without CUDA graphs (0 for an executor that
    captures every step, as our shard executor does). `attention_kernels`: a published attention
    kernel source asked first for the attention cores (dsim.profiling.attention_published: e.g.
    flashmla-published, DeepSeek's FlashMLA at its published rates, for a deployment that runs it)."""
    if not (0.0 <= float(eager_us_per_layer) < 1e6):
        raise InputError(f"--eager-us-per-layer: expected a finite value >= 0 (us), got {eager_us_per_layer!r}")
    roof = roofline or Roofline(hardware=hardware)
    attn_src = attention_source(attention_kernels, hardware)
    if attn_src is not None and "mla" not in model.attn_kinds:
        raise InputError(f"--attention-kernels {attention_kernels}: {model.name} has no MLA attention layers")
    pricer = Pricer(table, roof, frozenset(zero_ops), prefer, attn_src)
    tables = pricer.tables
    table = tables[0] if tables else None
    glue = fit_layer_glue(model, topo, hardware, pricer, layer_records, layer_source) if layer_records else LayerGlue()
    if max_capture is None:
        max_capture = 1024 if hardware == "b300" else 512  # vLLM: 1024 on data-center Blackwell
    caps = vllm_capture_sizes(max_capture)
    limit = caps[-1]
    fq = max(1, int(forward_q))
    chunk = (VLLM_MOE_DP_CHUNK if moe_dp_chunk is None else max(0, int(moe_dp_chunk))) if topo.attn_dp > 1 else 0
    tokens = forward_sizes(caps, chunk)
    fwd = np.array(
        [
            forward_ms(
                model, topo, hardware, n, pricer, limit, glue=glue, q=fq, moe_chunk=chunk, eager_us=eager_us_per_layer
            )
            for n in tokens
        ]
    )
    overlap_note = None
    if overlap != "none":
        fwd, overlap_note = overlapped_forward(
            model,
            topo,
            hardware,
            tokens,
            fwd,
            pricer,
            limit,
            glue,
            fq,
            dbo_threshold,
            moe_chunk=chunk,
            decode_tokens_max=max(limit, max_num_seqs * fq) if request_attention else None,
            eager_us=eager_us_per_layer,
        )
    # KV slope: attention cores of SLOPE_BATCH requests of fq query tokens at two contexts, per KV token
    lo = _attn_only(model, topo, hardware, pricer, phase="decode", batch=SLOPE_BATCH, q=fq, kv=KV_LO)
    hi = _attn_only(model, topo, hardware, pricer, phase="decode", batch=SLOPE_BATCH, q=fq, kv=KV_HI)
    slope_ms_per_tok = max(0.0, (hi - lo) / (SLOPE_BATCH * (KV_HI - KV_LO)))
    # the table was priced at KV_LO context per request: take that context's share out (zero-context table)
    reqs = np.array([-(-n // max(1, min(fq, n))) for n in tokens])
    fwd = np.maximum(fwd - slope_ms_per_tok * reqs * KV_LO, 1e-3)
    fwd_lift = np.maximum.accumulate(fwd) - fwd  # what the non-decreasing table adds above a size's own price
    fwd = fwd + fwd_lift
    # prefill terms: what a prompt chunk of q tokens over c cached costs beyond the q decode tokens the
    # forward table priced it as (q one-token requests at zero context plus the KV slope), less the
    # LM-head rows it skips, from the table's one-chunk attention-core records (fitted below, once the
    # step terms are known)
    lm = [
        pricer.ms(_op("lm_head", 1, op="gemm", dtype="bf16", m=m, n=model.vocab // topo.attn_tp, k=model.hidden))
        for m in (8192, 16384)
    ]
    lm_per_tok = max(0.0, (lm[1] - lm[0]) / 8192)
    excess = []
    for qn in PREFILL_Q:
        decode_share = _attn_only(model, topo, hardware, pricer, phase="decode", batch=qn, q=1, kv=KV_LO)
        decode_share -= slope_ms_per_tok * qn * KV_LO
        for c in PREFILL_KV:
            t = _attn_only(model, topo, hardware, pricer, phase="prefill", batch=1, q=qn, kv=c)
            excess.append((qn, c, t - decode_share - slope_ms_per_tok * c - qn * lm_per_tok))
    last_slope = (fwd[-1] - fwd[-2]) / (tokens[-1] - tokens[-2]) * 1000
    draft = {}
    for kind in ("mtp", "eagle3", "dspark"):
        ms = [
            priced_total(
                model,
                topo,
                hardware,
                draft_ops(model, topo, hardware, kind, R, draft_block, chunk, verify_attention == "tokens"),
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
    keys_term = None
    table_pricer = None
    if step_keys:
        if not (step_indexer and request_attention) or pricer.table is None:
            raise InputError("--step-keys: needs a kernel table, --step-indexer and the per-request attention table")
        keys_term, rule = step_keys_term(
            model, topo, hardware, pricer, step_indexer_ms_per_mcell(model, topo, hardware, pricer)
        )
        free = without_split_combine(pricer.table, model, topo, rule, keys_term.combine_ms_per_work)
        table_pricer = Pricer([free] + pricer.tables[1:], roof, frozenset(zero_ops), prefer, attn_src)
    req_attn = (
        request_attention_table(model, topo, hardware, pricer, tokens, fq, slope_ms_per_tok, table_pricer)
        if request_attention
        else None
    )
    if req_attn is not None:
        req_attn = dataclasses.replace(req_attn, forward_share_ms=lifted_share(req_attn.forward_share_ms, fwd_lift))
    if verify_attention not in VERIFY_ATTENTION:
        raise InputError(f"--verify-attention {verify_attention!r}: expected one of {', '.join(VERIFY_ATTENTION)}")
    if verify_attention == "tokens":
        if req_attn is None:
            raise InputError("--verify-attention tokens: needs the per-request attention table (format 3)")
        req_attn = flattened_verify_attention(model, topo, hardware, pricer, req_attn)
    if step_indexer:
        if req_attn is None or not any(r == 4 for r in model.compress_ratios):
            raise InputError("--step-indexer: needs the per-request attention table and a model with an indexer (V4)")
        req_attn = dataclasses.replace(
            req_attn,
            indexer_ratio=4,
            indexer_ms_per_mcell=step_indexer_ms_per_mcell(model, topo, hardware, pricer),
            step_keys=keys_term,
        )
    if block_pool is not None:
        req_attn = with_block_pool(model, req_attn, block_pool)
    prefill = fit_prefill_terms(excess, req_attn if step_keys else None, last_slope)
    kv_gib, mem = kv_capacity(model, topo, hardware, max_num_seqs)
    hw = HARDWARE[hardware]
    if table is not None:
        # kernel times measured: by us (a measured profile) or read from published silicon tables (a
        # silicon-table profile), after the table asked first
        tk = table.provenance.get("kind")
        kind = tk if tk in ("measured", "silicon-table") else "analytical"
        src = (
            f"kernel table {table.name} ({table.provenance.get('kind')}: {table.provenance.get('method', '')}; "
            f"{table.provenance.get('engine', '')} {table.provenance.get('engine_version', '')})"
        )
        if len(tables) > 1:
            src += "; where it has no record: " + ", ".join(t.name for t in tables[1:])
        src += f"; lookups per table {dict(sorted(pricer.by_table.items()))}"
        if prefer:
            src += "; " + ", ".join(f"{op} from {name} first" for op, name in sorted(prefer.items()))
        if zero_ops:
            src += f"; {', '.join(sorted(zero_ops))} priced at 0 (one-GPU shard check)"
        if pricer.moe_as_gemm:
            src += (
                f"; {pricer.moe_as_gemm} routed-expert lookups of a few-expert EP rank priced as its experts' "
                "gate+up and down GEMMs (no moe record for the group in the tables)"
            )
        if pricer.grouped_as_single:
            src += (
                f"; {sum(pricer.grouped_as_single.values())} batched-GEMM lookups priced as the single GEMM of "
                "the same FLOPs and bytes (no batched record in the tables)"
            )
    else:
        kind, src = "analytical", "roofline only (no kernel table)"
    if attn_src is not None:
        src = (
            f"decode attention cores from {attn_src.name} ({attn_src.provenance['method']}; "
            f"{attn_src.provenance['source']}), their projections as their own GEMMs; the rest from " + src
        )
    fell = sum(pricer.fallback.values())
    tot = fell + sum(pricer.priced.values())
    method = (
        f"composed per kernel op from {src}; {fell} of {tot} op lookups fell back to the roofline "
        f"({', '.join(sorted(pricer.fallback)) or 'none'}); {topo.describe()}"
    )
    prov = dict(
        kind=kind,
        hardware=f"{topo.gpus} x {hw['name']}",
        gpus_per_replica=topo.gpus_per_replica,
        model=model.name,
        engine="vLLM-like (CUDA graphs at vLLM's capture sizes, chunked prefill)",
        engine_version="n/a",
        date=str(_dt.date.today()),
        method=method,
        command=command
        or f"dsim profile compose profile --model {model.name} --topology {topo.name} --hardware {hardware}"
        + (f" --kernels {table.name}" if table else ""),
        topology=dict(name=topo.name, gpus_per_node=topo.gpus, attn_tp=topo.attn_tp, attn_dp=topo.attn_dp, ep=topo.ep),
        model_source=model.source,
        hardware_source=hw["source"],
        assumptions=dict(
            expert_dtype=_dtypes(model, hardware)[1],
            dense_dtype="fp8 block-scaled",
            lockstep="DP ranks step together with similar batches; experts wait for the slowest EP rank "
            "(uniform top-k routing, EPLB-balanced)"
            if topo.attn_dp > 1
            else "TP ranks hold the same tokens; experts wait for the slowest EP rank",
            **(
                dict(
                    redundant_experts=f"{physical_experts(model, topo) - model.experts} redundant routed experts so "
                    f"that {model.experts} divide over EP{topo.ep} ({physical_experts(model, topo) // topo.ep} per "
                    "GPU; DeepSeek's EP144 decode layout, open-infra-index day 6), routing uniform over the copies"
                )
                if physical_experts(model, topo) != model.experts
                else {}
            ),
            graph_gap_us_per_layer=GRAPH_GAP_US_PER_LAYER,
            eager_us_per_layer=eager_us_per_layer,
            activation_reserve_gb=ACTIVATION_RESERVE_GB,
            gpu_memory_utilization=MEM_UTIL,
            kv_layout="V4: compressed entries FP8 + bf16 rope, indexer keys FP8; MLA: bf16 latent",
            max_num_seqs_windows_reserved=max_num_seqs,
            **(
                dict(
                    step_indexer="the lightning indexer scores every token of a step over the step's longest "
                    "context (our shard executor; vLLM's kernels score each request over its own): "
                    "request_attention.step_indexer prices the extra logits cells (format 4)"
                )
                if step_indexer
                else {}
            ),
            **(
                dict(
                    step_keys="every token's key lists (csa top-k selection, hca compressed entries, window) as long "
                    "as the step's longest, split-K decided by the step's own tokens (our shard executor, "
                    "validator/gpu/moe_ops.py plan_work): request_attention.step_keys prices the padded key cells "
                    "and the split's combine; the per-request table is priced without any combine (format 4)"
                )
                if step_keys
                else {}
            ),
            draft_block=draft_block,
            **(
                dict(
                    verify_attention="each verify token priced as a one-token decode of its request's context "
                    "(DeepSeek's V4 kernels process a step's tokens as independent elements, DSpark paper "
                    "Sec. 5.3); an upper bound on a kernel that reads a request's shared keys once"
                )
                if verify_attention == "tokens"
                else {}
            ),
            forward_table=f"steps priced as requests of {max(1, int(forward_q))} query token(s) each"
            + (
                "; decode/verify attention priced per request from request_attention (format 3)"
                if request_attention
                else ""
            ),
            moe_dp_chunk=(
                f"the MoE block (experts, dispatch, combine) in chunks of {chunk} tokens per DP rank, as vLLM's "
                "chunking MoE runner with the DeepEP low-latency kernels (VLLM_MOE_DP_CHUNK_SIZE)"
                if chunk
                else "one MoE pass per step"
            ),
            overlap=overlap_note or "none: every op of a step in sequence (all-to-all exposed)",
            roofline=roof.provenance["method"],
        ),
        memory_per_gpu_gb=mem,
        prefill_fit=prefill.fit,
    )
    if table is not None:
        prov["kernel_table"] = dict(
            name=table.name, file=table.source_path.split("profiles/")[-1], provenance=table.provenance
        )
        if len(tables) > 1:
            prov["kernel_table_fallbacks"] = [dict(name=t.name, provenance=t.provenance) for t in tables[1:]]
    if attn_src is not None:
        prov["attention_kernels"] = dict(name=attn_src.name, **attn_src.provenance)
    if glue.fit:
        prov["layer_glue"] = glue.fit
    if table_error:
        prov["kernel_table_error"] = table_error
    guarded = [(t.name, t.provenance["table_guard"]) for t in tables if t.provenance.get("table_guard")]
    if guarded:  # kernel_aic.moe_guard: silicon-table records read past their range or implausibly
        prov["assumptions"]["table_guard"] = (
            "; ".join(
                f"kernel table {n}: {g['records']} moe records at ep {g['eps']} guarded, priced by "
                + ", ".join(f"{k} ({v})" for k, v in g["priced_by"].items())
                for n, g in guarded
            )
            + f" (fallback order: {guarded[0][1]['order']})"
        )
    return Profile(
        name=name or f"{model.name}-{hardware}-{topo.name}",
        provenance=prov,
        kv_cache_gib=round(float(kv_gib), 2),
        kv_bytes_per_token=float(model.kv_bytes_per_token()),
        cpu_overhead_ms=cpu_overhead_ms,
        capture_sizes=tuple(caps),
        forward=Table(np.array(tokens, dtype=float), fwd),
        kv_ms_per_ktok=float(slope_ms_per_tok * 1000),
        draft=draft,
        prefill_v2=prefill,
        format_version=profile_format(req_attn),
        request_attention=req_attn,
    )


def profile_format(req_attn: RequestAttention | None) -> int:
    """The lowest profile format that holds the per-request attention table's terms (dsim.cost)."""
    if req_attn is None:
        return 1
    if req_attn.block_pool is not None:
        return 5
    return 4 if req_attn.indexer_ratio or req_attn.step_keys else 3


def with_block_pool(model: MoEModel, req_attn: RequestAttention | None, fit: dict) -> RequestAttention:
    """The per-request table with a format-5 block_pool term from a fit (``python3 -m
    validator.gpu.shard_repredict fit-pool``: kinds of ratio, layers, ms_per_step, ms_per_block,
    priced_from_q). Every ratio must be one of the model's compressed kinds, and its priced_from_q
    what this table's grid gives (the fit applied the term where this table does not price it)."""
    if req_attn is None:
        raise InputError("--block-pool: needs the per-request attention table (format 3)")
    kinds = []
    for i, k in enumerate(fit.get("kinds") or []):
        try:
            ratio, layers = int(k["ratio"]), int(k["layers"])
            per_step, per_block, from_q = float(k["ms_per_step"]), float(k["ms_per_block"]), int(k["priced_from_q"])
        except (KeyError, TypeError, ValueError):
            raise InputError(
                f"--block-pool: kinds[{i}]: needs ratio, layers, ms_per_step, ms_per_block, priced_from_q"
            ) from None
        if ratio not in model.compress_ratios or layers != model.compress_ratios.count(ratio):
            raise InputError(f"--block-pool: kinds[{i}]: ratio {ratio} x {layers} layers is not in {model.name}")
        want = priced_from_q(ratio, req_attn.q, req_attn.ctx)
        if from_q != want:
            raise InputError(
                f"--block-pool: kinds[{i}]: priced_from_q {from_q}, but this table's records complete ratio-{ratio} "
                f"blocks from q = {want} (0: never)"
            )
        if per_step < 0 or per_block < 0:
            raise InputError(f"--block-pool: kinds[{i}]: a negative cost")
        kinds.append(BlockPoolKind(ratio, layers, per_step, per_block, from_q))
    if not kinds:
        raise InputError("--block-pool: no kinds")
    src = str(fit.get("source") or "")
    return dataclasses.replace(req_attn, block_pool=BlockPool(tuple(kinds), src))


def block_pool_source(fit: dict, path: str) -> str:
    """The provenance line of a block_pool fit file: what was replayed, and how it was fitted."""
    return (
        f"{path}: fitted by validator.gpu.shard_repredict fit-pool (least absolute deviations, a level per design "
        f"set) on {len(fit.get('steps') or [])} steps of {fit.get('design', '?')} replayed in {fit.get('replay', '?')}"
    )


def fit_prefill_terms(
    excess: Sequence[tuple[int, int, float]], step_attention: RequestAttention | None, last_slope_ms_per_ktok: float
) -> PrefillTerms:
    """prefill_terms version 2 (dsim.cost module doc) from (q, c, excess ms) points: what one chunk
    of q tokens over c cached costs beyond its q decode tokens, from the kernel table's one-chunk
    records. With the executor's step-keys terms (``step_attention`` carries them) a chunk's own key
    lists are priced at those terms' cell prices, not fitted (own_keys_tokens: a decode token of
    the forward table, one token over KV_LO cached), and only a signed per-token and a per-step
    rest are fitted on what they leave; otherwise cached pairs, within-chunk pairs (both >= 0), a
    signed per-token term and a per-step term (>= 0) are fitted, least squares in ms. A lone
    chunk's fixed excess is its step's: the fit cannot tell per chunk from per step, and both
    executors run a step's chunks in one attention launch per layer, so it is priced per step.
    A negative per-token term is held so that a prompt token costs at most 0.9 of the forward
    table's last slope less than a decode token."""
    from scipy.optimize import lsq_linear

    from dsim.cost import PrefillTerms, own_keys_ms, prefill_discount_bound_ms_per_ktok

    q = np.array([e[0] for e in excess], dtype=float)
    c = np.array([e[1] for e in excess], dtype=float)
    y = np.array([e[2] for e in excess], dtype=float)
    own_tokens = KV_LO + 1 if step_attention is not None and step_attention.step_keys else 0
    base = PrefillTerms(own_keys_tokens=own_tokens)
    own = np.array([own_keys_ms(int(a), int(b), base, step_attention) for a, b in zip(q, c)])
    cols = {"token_ms_per_ktok": q / 1000, "ms_per_step": np.ones_like(q)}
    if not own_tokens:
        cols = {"cached_ms_per_mpair": q * c / 1e6, "within_ms_per_mpair": q * q / 2e6, **cols}
    names = list(cols)
    lo = [-np.inf if k == "token_ms_per_ktok" else 0.0 for k in names]
    sol = lsq_linear(np.stack([cols[k] for k in names], axis=1), y - own, bounds=(lo, [np.inf] * len(names)))
    coef = dict(zip(names, (float(v) for v in sol.x)))
    terms = PrefillTerms(own_keys_tokens=own_tokens, **coef)  # type: ignore[arg-type]
    bound = prefill_discount_bound_ms_per_ktok(terms, step_attention)
    if bound > 0.9 * last_slope_ms_per_ktok:
        coef["token_ms_per_ktok"] += bound - 0.9 * last_slope_ms_per_ktok
        terms = PrefillTerms(own_keys_tokens=own_tokens, **coef)  # type: ignore[arg-type]
    pred = own + sum(coef[k] * cols[k] for k in names)
    resid = y - pred
    old_resid = _v1_prefill_residual(q, c, y, last_slope_ms_per_ktok)
    fit = dict(
        form="prefill_terms version 2: "
        + (
            "own key lists at the step-keys and indexer cell prices, plus a signed per-token and a per-step rest"
            if own_tokens
            else "cached pairs, within-chunk pairs, a signed per-token and a per-step term"
        ),
        records="one-chunk attention-core records (batch 1, prefill phase) of the kernel table, less the q one-token "
        "decode records (batch q, KV_LO context, less the KV slope) the forward table priced the chunk as, the KV "
        "slope of the cached tokens and the LM-head rows a prompt token skips",
        q=sorted({int(v) for v in q}),
        cached=sorted({int(v) for v in c}),
        points=len(y),
        terms={k: round(v, 6) for k, v in coef.items()},
        residual_ms_max=round(float(np.abs(resid).max()), 4),
        residual_ms_median=round(float(np.median(np.abs(resid))), 4),
        residual_rel_median=round(float(np.median(np.abs(resid) / np.maximum(np.abs(y), 1.0))), 4),
        residual_ms_max_version_1=round(float(old_resid), 4),
    )
    return dataclasses.replace(terms, fit=fit)


def _v1_prefill_residual(q: np.ndarray, c: np.ndarray, y: np.ndarray, last_slope_ms_per_ktok: float) -> float:
    """The largest residual of the version-1 form (pairs q (c + q / 2) x a rate minus a per-token
    discount, both >= 0) on the same points: the fit version 2 replaces, kept in provenance."""
    from scipy.optimize import nnls

    x, k = q * (c + q / 2) / 1e6, q / 1000
    (a, d), _ = nnls(np.stack([x, -k], axis=1), y)
    d = min(d, 0.9 * last_slope_ms_per_ktok)
    return float(np.abs(y - a * x + d * k).max())


def forward_sizes(caps: Sequence[int], moe_chunk: int = 0) -> list[int]:
    """The forward table's sizes: vLLM's capture sizes (a step is padded to the next one), then sizes
    above the capture limit dense enough that linear interpolation follows the composed cost:
    limit + 1, TAIL_TOKENS, TAIL_SPACING's grid and, with the MoE in chunks of `moe_chunk` tokens per rank,
    CHUNK_OFFSETS around every chunk boundary (up to TAIL_TOKENS[-1])."""
    caps = [int(c) for c in caps]
    limit, top = caps[-1], TAIL_TOKENS[-1]
    # limit + 1: the first size without a CUDA graph, so the graph-less overhead is a jump at the limit
    # (vLLM runs a step above its largest capture size without graphs), not a ramp to the next tail size
    extra = set(TAIL_TOKENS) | {limit + 1}
    lo = limit
    for hi, step in TAIL_SPACING:
        extra.update(range((lo // step + 1) * step, hi + 1, step))
        lo = max(lo, hi)
    if moe_chunk > 0:
        for b in range(moe_chunk, top, moe_chunk):
            extra.update(b + j for j in CHUNK_OFFSETS)
    return caps + sorted(t for t in extra if limit < t <= top)


def required_ops(
    model: MoEModel,
    topo: Topology,
    hardware: str,
    max_capture: int | None = None,
    draft_block: int = 7,
    forward_q: int = 1,
    moe_dp_chunk: int | None = None,
    overlap: str = "none",
    new_points: bool = True,
) -> list[dict]:
    """Every op record compose_profile looks up (without 'ms'), deduplicated, sorted; of the per-request
    attention table, its points on the kernel-op grid (the rest interpolate between them). new_points=False:
    without the capture limit + 1 forward point (unless a MoE chunk boundary puts it there) and the
    fixed-length drafter records, which tables built before them lack (the composer interpolates them)."""
    if max_capture is None:
        max_capture = 1024 if hardware == "b300" else 512
    caps = vllm_capture_sizes(max_capture)
    ops: list[Op] = []
    fq = max(1, int(forward_q))
    chunk = (VLLM_MOE_DP_CHUNK if moe_dp_chunk is None else max(0, int(moe_dp_chunk))) if topo.attn_dp > 1 else 0
    tokens = forward_sizes(caps, chunk)
    if not new_points and not (chunk and caps[-1] % chunk == 0):
        tokens = [n for n in tokens if n != caps[-1] + 1]
    for n in tokens:
        qq = min(fq, n)
        ops += step_ops(model, topo, hardware, n, q=qq, batch=-(-n // qq))
        if chunk:
            ops += step_ops(model, topo, hardware, n, q=qq, batch=-(-n // qq), moe_chunk=chunk)
        if overlap != "none" and n >= 2:  # the two micro-batches' layers
            for h in {-(-n // 2), n // 2}:
                qh = min(fq, h)
                ops += layer_ops(model, topo, hardware, h, q=qh, batch=-(-h // qh), moe_chunk=chunk)
    # the per-request attention table at the fixed grid's points (batch powers of two, REQ_CTX_GRID);
    # its other points interpolate along the attention series a table holds there
    for B in (b for b in vllm_capture_sizes(REQ_BATCH_MAX) if b & (b - 1) == 0):
        for q in REQ_Q:
            for c in REQ_CTX_GRID:
                ops += [o for o in layer_ops(model, topo, hardware, B * q, batch=B, q=q, kv=c) if o.part == "attn_core"]
    for kv in (KV_LO, KV_HI):
        ops += [
            o
            for o in layer_ops(model, topo, hardware, SLOPE_BATCH * fq, batch=SLOPE_BATCH, q=fq, kv=kv)
            if o.part == "attn_core"
        ]
    for qn in PREFILL_Q:
        for c in PREFILL_KV:
            ops += [
                o
                for o in layer_ops(model, topo, hardware, qn, phase="prefill", batch=1, q=qn, kv=c)
                if o.part == "attn_core"
            ]
    for m in (8192, 16384):
        ops.append(_op("lm_head", 1, op="gemm", dtype="bf16", m=m, n=model.vocab // topo.attn_tp, k=model.hidden))
    for kind in ("mtp", "eagle3", "dspark"):
        # the kernel collections' grid (powers of two); the drafter's other sizes and its flattened
        # block read the tables between these records, as every lookup off the grid does
        for R in DRAFT_COLLECTED_REQUESTS:
            ops += draft_ops(model, topo, hardware, kind, R, draft_block, chunk)
    for kb in range(1, draft_block) if new_points else ():  # the fixed lengths' drafter tables (dspark@K)
        for R in DRAFT_REQUESTS:
            ops += draft_ops(model, topo, hardware, "dspark", R, kb, chunk)
    seen = {op.record for op in ops}
    return sorted((dict(r) for r in seen), key=lambda r: json.dumps(r, sort_keys=True))


# ---------------------------------------------------------------------------------------- by hardware and backend
BACKENDS = ("vllm", "sglang", "trtllm")  # the serving engines whose kernels AIC's tables measured


def shipped_table_for(hardware: str, backend: str, topology: str) -> KernelTable:
    """The shipped silicon-table kernel table profiles/kernels/<hardware>-aic-<backend>.json.gz for a
    shipped topology; anything else is priced from AIC's tables on demand by
    dsim.profiling.aic_tables.compose_for (`dsim profile aic profile`, the aic extra), which sits
    above this module (it prices the composer's records)."""
    from dsim.profiling.kernel_tables import kernel_table_path

    if backend not in BACKENDS:
        raise InputError(f"--backend {backend!r}: one of {', '.join(BACKENDS)}")
    if hardware not in HARDWARE:
        raise InputError(f"--hardware {hardware!r}: one of {', '.join(sorted(HARDWARE))}")
    shipped = kernel_table_path(f"{hardware}-aic-{backend}")
    if shipped.is_file() and topology in ("dp8-ep8", "tp8-ep8"):
        return load_kernel_table(str(shipped))
    raise InputError(
        f"--backend {backend}: no shipped {hardware}-aic-{backend} table for {topology}; "
        f"`dsim profile aic profile --model MODEL --hardware {hardware} --backend {backend} "
        f"--topology {topology} --out FILE` prices it from AIC's tables on demand (pip install -e '.[aic]')"
    )


# ---------------------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="dsim profile compose", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("required-ops", "profile"):
        p = sub.add_parser(name)
        p.add_argument("--model", required=True)
        p.add_argument("--topology", required=True)
        p.add_argument("--hardware", required=True, choices=sorted(HARDWARE))
        p.add_argument("--max-capture", type=int, default=None)
        p.add_argument(
            "--eager-us-per-layer",
            type=float,
            default=EAGER_US_PER_LAYER,
            help=f"what each layer adds to a step above the capture limit, run without CUDA graphs (default "
            f"{EAGER_US_PER_LAYER:g}, stated; 0 for an executor that captures every step)",
        )
        p.add_argument("--draft-block", type=int, default=7)
        p.add_argument(
            "--forward-q",
            type=int,
            default=1,
            help="price the forward table as requests of this many query tokens each (default 1: decode tokens)",
        )
        p.add_argument(
            "--moe-dp-chunk",
            type=int,
            default=None,
            help="data-parallel topologies: run the MoE block in chunks of this many tokens per rank "
            f"(default {VLLM_MOE_DP_CHUNK}, vLLM's VLLM_MOE_DP_CHUNK_SIZE; 0: one pass, as the shard executor)",
        )
        p.add_argument(
            "--overlap",
            choices=OVERLAPS,
            default="none",
            help="dbo: two-batch overlap, the all-to-all of one micro-batch hidden behind the other's compute "
            "(DeepSeek-V3 report Sec. 3.4; vLLM --enable-dbo); DP + EP topologies only",
        )
        p.add_argument(
            "--dbo-threshold",
            default=str(DBO_DECODE_TOKEN_THRESHOLD),
            help="with --overlap dbo: split steps of at least this many tokens per rank (default 32, vLLM's "
            "dbo_decode_token_threshold), or 'auto' (from where splitting is no slower)",
        )
        p.add_argument(
            "--expert-dtype",
            choices=("fp8", "fp4", "w4a16"),
            default=None,
            help="serve the routed experts in this dtype (default: as released where the hardware runs "
            "it natively, else the FP8-expert variant)",
        )
    prof = sub.choices["profile"]
    prof.add_argument(
        "--kernels",
        default=None,
        help="kernel table(s), comma-separated in order of preference (profiles/kernels/NAME.json; NAME@HW: "
        "that table carried to hardware HW by the per-op roofline ratio); roofline if absent",
    )
    prof.add_argument(
        "--backend",
        choices=BACKENDS,
        default=None,
        help="without --kernels: AIC's silicon tables of this serving engine on --hardware (the shipped "
        "<hardware>-aic-<backend> table; others: dsim profile aic profile); the name carries it",
    )
    prof.add_argument(
        "--attention-kernels",
        choices=ATTENTION_KERNELS,
        default=None,
        help="price the MLA decode attention cores from a published kernel source (flashmla-published: DeepSeek's "
        "FlashMLA at its README's H800 rates, for a deployment that runs DeepSeek's kernels) instead of the tables' "
        "attention records; the projections then priced as their own GEMMs",
    )
    prof.add_argument("--prefer", default="", help="op=TABLE,...: the table asked first for that op kind")
    prof.add_argument("--zero-ops", default="", help="op kinds priced at 0, e.g. comm (a one-GPU shard check)")
    prof.add_argument(
        "--layer-records",
        default=None,
        help="JSON of measured 'layer' records: fit the per-layer glue on them (half fit, half check)",
    )
    prof.add_argument(
        "--no-request-attention",
        action="store_true",
        help="leave out the per-request attention table (profile format 3): attention priced by total tokens and KV",
    )
    prof.add_argument(
        "--step-indexer",
        action="store_true",
        help="V4: add the longest-context indexer term (profile format 4) of an executor that scores every token of a "
        "step over the step's longest context, as our H200 shard executor does (not vLLM)",
    )
    prof.add_argument(
        "--step-keys",
        action="store_true",
        help="V4 (with --step-indexer): price the attention cores' key lists as our H200 shard executor runs them, "
        "every token's as long as the step's longest and split-K by the step's own tokens (profile format 4; not vLLM)",
    )
    prof.add_argument(
        "--verify-attention",
        choices=VERIFY_ATTENTION,
        default="window",
        help="price a q-token verify window as the kernel tables' window records (default) or as q one-token "
        "decodes at the request's context (tokens: kernels that process tokens as independent elements)",
    )
    prof.add_argument(
        "--block-pool",
        default=None,
        help="JSON of a block_pool fit (python3 -m validator.gpu.shard_repredict fit-pool): price pooling completed "
        "compressed-cache blocks as our H200 shard executor runs it (profile format 5; not vLLM)",
    )
    prof.add_argument("--name", default=None)
    prof.add_argument("--out", required=True)
    prof.add_argument(
        "--table-error", default=None, help="JSON file: the table's measured error (carried into provenance)"
    )
    a = ap.parse_args(argv)
    from dsim.cli.toolmain import run_tool

    return run_tool("dsim profile compose", lambda: _run(a, argv))


def _run(a, argv: list[str] | None) -> int:
    """The command ``a`` (parsed arguments); InputError for bad input (see dsim.toolmain)."""
    if a.cmd == "profile":
        from dsim.outputs import check_file_target

        check_file_target(a.out, "--out")  # refused before any work
    model = load_model(a.model)
    if a.expert_dtype:
        if a.expert_dtype == "fp4" and HARDWARE[a.hardware]["fp4"] is None:
            raise InputError(
                f"--expert-dtype fp4: {HARDWARE[a.hardware]['name']} has no FP4 tensor cores (use w4a16 or fp8)"
            )
        model = dataclasses.replace(model, expert_dtype=a.expert_dtype)
    topo = parse_topology(a.topology)
    if a.cmd == "required-ops":
        json.dump(
            required_ops(
                model,
                topo,
                a.hardware,
                a.max_capture,
                a.draft_block,
                a.forward_q,
                moe_dp_chunk=a.moe_dp_chunk,
                overlap=a.overlap,
            ),
            sys.stdout,
            indent=0,
        )
        sys.stdout.write("\n")
        return 0
    table = [load_table_spec(k.strip()) for k in a.kernels.split(",") if k.strip()] if a.kernels else None
    if a.backend and table is None:
        table = [shipped_table_for(a.hardware, a.backend, topo.name)]
        kern = f"-{a.attention_kernels.split('-')[0]}" if a.attention_kernels else ""  # e.g. -flashmla
        a.name = a.name or f"{model.name}-{a.hardware}-{a.backend}{kern}-{topo.name}" + (
            "-dbo" if a.overlap == "dbo" else ""
        )
    zero = frozenset(x.strip() for x in a.zero_ops.split(",") if x.strip())
    prefer = {}
    for item in (x.strip() for x in a.prefer.split(",") if x.strip()):
        op, eq, tname = item.partition("=")
        if not eq:
            raise InputError(f"--prefer {item!r}: expected OP=TABLE, e.g. mhc=h200-aic-vllm")
        prefer[op.strip()] = tname.strip()
    from dsim.schema import read_json

    layer_recs = None
    if a.layer_records:
        d = read_json(a.layer_records, what="--layer-records")
        layer_recs = d.get("records") if isinstance(d, dict) else d
        if not isinstance(layer_recs, list) or not all(isinstance(r, dict) for r in layer_recs):
            raise InputError(f"--layer-records {a.layer_records}: expected a list of records (or {{'records': [...]}})")
    err = read_json(a.table_error, what="--table-error") if a.table_error else None
    if err is not None and not isinstance(err, dict):
        raise InputError(f"--table-error {a.table_error}: expected a JSON object (kernels_aic --error-summary)")
    pool = None
    if a.block_pool:
        pool = read_json(a.block_pool, what="--block-pool")
        if not isinstance(pool, dict):
            raise InputError(f"--block-pool {a.block_pool}: expected a JSON object (shard_repredict fit-pool)")
        pool.setdefault("source", block_pool_source(pool, a.block_pool))
    cmd = "dsim profile compose " + " ".join(argv if argv is not None else sys.argv[1:])
    prof_ = compose_profile(
        model,
        topo,
        a.hardware,
        table,
        name=a.name,
        max_capture=a.max_capture,
        draft_block=a.draft_block,
        table_error=err,
        command=cmd,
        zero_ops=zero,
        layer_records=layer_recs,
        layer_source=a.layer_records or "",
        prefer=prefer,
        forward_q=a.forward_q,
        moe_dp_chunk=a.moe_dp_chunk,
        request_attention=not a.no_request_attention,
        step_indexer=a.step_indexer,
        step_keys=a.step_keys,
        overlap=a.overlap,
        dbo_threshold=parse_dbo_threshold(a.dbo_threshold),
        verify_attention=a.verify_attention,
        eager_us_per_layer=a.eager_us_per_layer,
        block_pool=pool,
        attention_kernels=a.attention_kernels,
    )
    if a.backend:
        prof_.provenance["backend"] = a.backend
    save_profile(prof_, a.out)
    print(f"wrote {a.out}: {prof_.label}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
