"""One engine step on one GPU as kernel ops: the op records (a kernel table's keys) of the decoder layers,
the embedding, the final norm and the LM head for n tokens under a topology (``layer_ops``, ``step_ops``),
and the records of the layer parts an attention-module record includes (``included_part_records``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from dsim.profiling.kernel_tables import HARDWARE
from dsim.profiling.models import MoEModel, infer_model, load_model
from dsim.profiling.topology import Topology, physical_experts

if TYPE_CHECKING:
    from collections.abc import Sequence


KV_LO, KV_HI = 1024, 16384  # contexts the KV slope is measured between


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


def kernel_op(part: str, count: float, **rec) -> Op:
    if rec.get("groups") == 1:  # one product: a plain GEMM record
        del rec["groups"]
    return Op(tuple(sorted(rec.items())), part, float(count))


def served_dtypes(model: MoEModel, hardware: str) -> tuple[str, str]:
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
    dt, edt = served_dtypes(model, hardware)
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
    ops.append(kernel_op("norms", L, op="elementwise", bytes=int(n * h * 2 * 2 * 2 * max(1, model.hc_mult // 2))))
    if model.family == "deepseek_v4":
        ops.append(kernel_op("mhc", L, op="mhc", tokens=int(n), hidden=h, hc_mult=model.hc_mult))
        ops.append(kernel_op("q_proj", L, op="gemm", dtype=dt, m=int(n), n=model.q_lora_rank, k=h))
        ops.append(
            kernel_op(
                "q_proj", L, op="gemm", dtype=dt, m=int(n), n=model.heads // tp * model.head_dim, k=model.q_lora_rank
            )
        )
        ops.append(kernel_op("kv_proj", L, op="gemm", dtype=dt, m=int(n), n=model.head_dim, k=h))
        # grouped low-rank output projection (wo_a): og local groups, each [n, heads/o_groups x head_dim] x
        # [.., o_lora]; engines run it as one batched GEMM (DeepSeek's reference einsum "tgd,grd->tgr";
        # vLLM marks wo_a is_bmm over the local groups), then wo_b over the concatenated groups
        og = max(1, model.o_groups // tp)
        ops.append(
            kernel_op(
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
        ops.append(kernel_op("o_proj", L, op="gemm", dtype=dt, m=int(n), n=h, k=og * model.o_lora_rank))
        # compressor: fused wkv + wgate, each coff x head_dim wide (coff = 2 at ratio 4, overlapping blocks;
        # 1 at ratio 128), bf16 weights in the released checkpoint (not FP8-quantized)
        for kind, coff in (("v4_csa", 2), ("v4_hca", 1)):
            if kinds.get(kind):
                ops.append(
                    kernel_op(
                        "compressor", kinds[kind], op="gemm", dtype="bf16", m=int(n), n=2 * coff * model.head_dim, k=h
                    )
                )
        if kinds.get("v4_csa"):
            c = kinds["v4_csa"]
            # lightning indexer: wq_b (q_lora -> index heads x index dim, FP8), the per-head weights
            # (hidden -> index heads, bf16) and its own ratio-4 compressor (hidden -> 2 x 2 x index dim, bf16)
            ops.append(
                kernel_op(
                    "indexer_proj",
                    c,
                    op="gemm",
                    dtype=dt,
                    m=int(n),
                    n=model.index_heads * model.index_dim,
                    k=model.q_lora_rank,
                )
            )
            ops.append(kernel_op("indexer_proj", c, op="gemm", dtype="bf16", m=int(n), n=model.index_heads, k=h))
            ops.append(kernel_op("indexer_proj", c, op="gemm", dtype="bf16", m=int(n), n=4 * model.index_dim, k=h))
    else:
        hl = model.heads // tp
        ops.append(kernel_op("q_proj", L, op="gemm", dtype=dt, m=int(n), n=model.q_lora_rank, k=h))
        ops.append(kernel_op("q_proj", L, op="gemm", dtype=dt, m=int(n), n=hl * model.head_dim, k=model.q_lora_rank))
        ops.append(kernel_op("kv_proj", L, op="gemm", dtype=dt, m=int(n), n=model.kv_lora_rank + model.rope_dim, k=h))
        # absorbed MLA: q_nope x W_UK and the latent output x W_UV per local head, one batched GEMM each
        # (vLLM's MLA backends run torch.bmm over the heads: hl products of m = n tokens, all heads' weights)
        ops.append(
            kernel_op(
                "mla_absorb", L, op="gemm", dtype="bf16", m=int(n), n=model.kv_lora_rank, k=model.nope_dim, groups=hl
            )
        )
        ops.append(
            kernel_op(
                "mla_absorb", L, op="gemm", dtype="bf16", m=int(n), n=model.v_head_dim, k=model.kv_lora_rank, groups=hl
            )
        )
        ops.append(kernel_op("o_proj", L, op="gemm", dtype=dt, m=int(n), n=h, k=hl * model.v_head_dim))
    for kind, c in kinds.items():
        ops.append(kernel_op("attn_core", c, **attn_record(model, topo, kind, phase, B, q, kv)))
    if tp > 1:
        ops.append(kernel_op("comm", L, op="comm", kind="all_reduce", gpus=tp, bytes=int(n * h * 2)))
    if dense_count:
        ops.append(
            kernel_op("dense_mlp", dense_count, op="gemm", dtype=dt, m=int(n), n=2 * model.dense_inter // tp, k=h)
        )
        ops.append(kernel_op("dense_mlp", dense_count, op="gemm", dtype=dt, m=int(n), n=h, k=model.dense_inter // tp))
    if moe_count:
        learned = moe_count - (
            min(model.hash_layers, moe_count) if layers is None else sum(1 for i in idx if i < model.hash_layers)
        )
        if learned:
            ops.append(kernel_op("router", learned, op="gemm", dtype="bf16", m=int(n), n=model.experts, k=h))
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


def _moe_block_ops(model: MoEModel, topo: Topology, dt: str, edt: str, n: int, count: float) -> list[Op]:
    """The MoE block of `count` layer passes over n tokens per rank: shared expert, the routed
    experts of the EP group's tokens (n x DP ranks), dispatch / combine or the TP all-reduce."""
    h, tp = model.hidden, topo.attn_tp
    ops: list[Op] = []
    if model.shared_experts:
        si = model.shared_experts * model.moe_inter // tp
        ops.append(kernel_op("shared_expert", count, op="gemm", dtype=dt, m=int(n), n=2 * si, k=h))
        ops.append(kernel_op("shared_expert", count, op="gemm", dtype=dt, m=int(n), n=h, k=si))
    T = n * topo.attn_dp
    ops.append(
        kernel_op(
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
        ops.append(
            kernel_op("comm", count, op="comm", kind="a2a_dispatch", gpus=topo.ep, bytes=int(n * h * 1), **scope)
        )
        ops.append(kernel_op("comm", count, op="comm", kind="a2a_combine", gpus=topo.ep, bytes=int(n * h * 2), **scope))
    elif tp > 1:
        ops.append(kernel_op("comm", count, op="comm", kind="all_reduce", gpus=tp, bytes=int(n * h * 2)))
    return ops


def step_ops(model: MoEModel, topo: Topology, hardware: str, n: int, **kw: Any) -> list[Op]:
    """All ops of one target forward of n tokens on one GPU: embedding, the decoder layers, the
    final norm and the LM head (vocabulary split over the TP ranks, logits gathered)."""
    ops = [kernel_op("embedding", 1, op="elementwise", bytes=int(n * model.hidden * 2 * 2))]
    ops += layer_ops(model, topo, hardware, n, **kw)
    ops.append(
        kernel_op("lm_head", 1, op="gemm", dtype="bf16", m=int(n), n=model.vocab // topo.attn_tp, k=model.hidden)
    )
    if topo.attn_tp > 1:
        ops.append(
            kernel_op(
                "comm",
                1,
                op="comm",
                kind="all_gather",
                gpus=topo.attn_tp,
                bytes=int(n * model.vocab // topo.attn_tp * 4),
            )
        )
    return ops
