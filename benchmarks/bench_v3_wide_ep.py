"""Wide-EP DeepSeek-V3 decode, composed, against DeepSeek's own published production figures.

Published (deepseek-ai/open-infra-index, 202502OpenSourceWeek, "Day 6: One More Thing, DeepSeek-V3/R1
Inference System Overview"): decode runs routed experts on EP144 (18 nodes of 8 H800, 32 redundant routed
experts, 2 routed + 1 shared expert per GPU) with MLA and the shared expert data-parallel over the 144
GPUs, two micro-batches overlapping the all-to-all; over 24 hours the average output speed was 20-22
tokens/s per user, the average KV-cache length per output token 4,989, and each H800 node delivered about
14.8k output tokens/s during decoding (1,850 per GPU). deepseek-ai/profile-data's decode trace: EP128,
128 requests per GPU, 4K prompts, two micro-batches (its configuration only: the trace's timings are not
read here).

Which figure is used for what (nothing is fitted on them; every kernel time comes from the tables):
- EP144, the 32 redundant experts and two-batch overlap: the configuration composed (inputs).
- KV 4,989: the context every request's attention reads (input).
- 20-22 tok/s per user (midpoint 21): check A's input, the batch per GPU at which the composed step
  runs at 21 tok/s per user; checked: the per-GPU throughput there against 1,850.
- 1,850 / 21 = 88 requests per GPU (Little's law on the two averages): check B's input; checked: the
  per-user speed and per-GPU throughput of the step at that batch (the same ratio, as both are the
  batch over the one step time).
- profile-data's EP128 x 128 requests x 4K: printed, not checked (no timing read).

Kernels: the MLA decode core at DeepSeek's FlashMLA published rates (deepseek-ai/FlashMLA README: up to 660
TFLOP/s compute-bound, 3000 GB/s memory-bound on H800 SXM5; dsim.profiling.attention_published), the kernel
DeepSeek's deployment runs; beside it, as a sensitivity, vLLM's MLA attention module as AIC timed it.

Hardware: composed on the H800 itself (its datasheet in dsim.profiling.kernel_tables.HARDWARE; AIC's H200 vLLM table
carried to it op by op with the roofline ratio, dsim.profiling.pricer.load_table_spec; DeepEP's all-to-all as
measured on H800, profiles/kernels/h800-deepep-ll-published.json), then on H100 and H200 to show what
each difference moves.

Usage: PYTHONPATH=. python3 benchmarks/bench_v3_wide_ep.py [--markdown]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import NamedTuple

from dsim.profiling.attention_published import FLASHMLA_H800_TFLOPS_FEB_2025, PublishedAttention
from dsim.profiling.forward import forward_ms
from dsim.profiling.kernel_ops import Op, step_ops
from dsim.profiling.kernel_tables import Roofline, load_kernel_table
from dsim.profiling.models import load_model
from dsim.profiling.overlap import A2A_KINDS, forward_ms_dbo
from dsim.profiling.pricer import Pricer, load_table_spec, priced_total
from dsim.profiling.topology import parse_topology

MODEL = "deepseek-v3"
TOPOLOGY = "dp144-ep144"
#: open-infra-index day 6: output tok/s per H800 node while decoding, per-user speed, KV per output token
PUBLISHED_NODE_TOK_S = 14_800.0
PUBLISHED_GPU_TOK_S = PUBLISHED_NODE_TOK_S / 8
PUBLISHED_USER_TOK_S = (20.0, 22.0)
USER_TOK_S = sum(PUBLISHED_USER_TOK_S) / 2
KV_TOKENS = 4_989
#: deepseek-ai/profile-data decode configuration
PROFILE_DATA = dict(topology="dp128-ep128", batch=128, kv=4_096)
TARGET_ERROR = 0.15
SOURCE_TABLE = "h200-aic-vllm"
A2A_TABLE = "h800-deepep-ll-published"
HARDWARE = ("h800", "h100", "h200")
#: the MLA decode core as DeepSeek's deployment runs it: FlashMLA at its published rates
#: (dsim.profiling.attention_published; `--attention-kernels flashmla-published`); None: vLLM's MLA
#: attention module as AIC timed it (projections included), the sensitivity beside it
ATTENTION = "flashmla-published"
ATTENTION_LABEL = {"flashmla-published": "FlashMLA (published rates)", None: "vLLM's MLA module (AIC table)"}
#: capture limit passed to the forward (no eager overhead below it; DeepSeek's engine runs graphs)
LIMIT = 1024


class Kernels(NamedTuple):
    """The kernel sources of one composition: the tables in order of preference, the attention source."""

    tables: list
    attention: PublishedAttention | None


def tables(hardware: str, attention: str | None = ATTENTION, tflops: float | None = None) -> Kernels:
    first = load_table_spec(SOURCE_TABLE if hardware == "h200" else f"{SOURCE_TABLE}@{hardware}")
    attn = None
    if attention is not None:
        attn = PublishedAttention(hardware) if tflops is None else PublishedAttention(hardware, tflops=tflops)
    return Kernels([first, load_kernel_table(A2A_TABLE)], attn)


class ScaledPricer(Pricer):
    """The composer's pricer with one factor per part of the step (the sensitivity's knobs; "attention"
    scales the MLA core and its projections together)."""

    def __init__(self, kern: Kernels, hardware: str, scale: dict | None = None):
        super().__init__(kern.tables, Roofline(hardware=hardware), attention=kern.attention)
        self.scale = scale or {}

    def ms(self, op: Op) -> float:
        v = super().ms(op)
        part = part_of(op)
        f = self.scale.get(part, self.scale.get("attention", 1.0) if part in ("mla_core", "projections") else 1.0)
        return v * f


def part_of(op: Op) -> str:
    """mla_core: the attention core (with vLLM's module from AIC's table, its projections included),
    projections: q / kv / o projections and the absorbed products where priced as their own ops."""
    rec = op.rec
    if op.part == "comm" and rec.get("kind") in A2A_KINDS:
        return "a2a"
    if op.part in ("moe_experts", "shared_expert", "dense_mlp"):
        return "experts"
    if op.part == "attn_core":
        return "mla_core"
    if op.part in ("q_proj", "kv_proj", "mla_absorb", "o_proj"):
        return "projections"
    return "other"


@dataclass(frozen=True)
class Point:
    hardware: str
    topology: str
    batch: float
    kv: int
    step_ms: float
    overlap: str | float

    @property
    def user_tok_s(self) -> float:
        return 1e3 / self.step_ms

    @property
    def gpu_tok_s(self) -> float:
        return self.batch * self.user_tok_s


def step_ms(hardware: str, topology: str, batch: int, kv: int, *, overlap="dbo", scale=None, tabs=None) -> float:
    """One decode step of `batch` one-token requests per GPU at `kv` context, composed (ms). overlap: "dbo"
    (two-batch overlap), "none", or a fraction f of the way from none to dbo (f x dbo + (1 - f) x none: an
    overlap that hides only part of what the schedule hides)."""
    if not isinstance(overlap, str):
        a = step_ms(hardware, topology, batch, kv, overlap="dbo", scale=scale, tabs=tabs)
        b = step_ms(hardware, topology, batch, kv, overlap="none", scale=scale, tabs=tabs)
        return overlap * a + (1 - overlap) * b
    m = load_model(MODEL)
    topo = parse_topology(topology)
    pr = ScaledPricer(tabs or tables(hardware), hardware, scale)
    if overlap == "dbo":
        return forward_ms_dbo(m, topo, hardware, batch, pr, LIMIT, kv=kv, threshold=1, moe_chunk=0)
    return forward_ms(m, topo, hardware, batch, pr, LIMIT, kv=kv, moe_chunk=0)


def point(hardware: str, topology: str, batch: float, kv: int, overlap="dbo", scale=None, tabs=None) -> Point:
    """Step time at a fractional batch: linear between the two whole batches around it."""
    lo = int(batch)
    t_lo = step_ms(hardware, topology, lo, kv, overlap=overlap, scale=scale, tabs=tabs)
    if batch == lo:
        return Point(hardware, topology, batch, kv, t_lo, overlap)
    t_hi = step_ms(hardware, topology, lo + 1, kv, overlap=overlap, scale=scale, tabs=tabs)
    return Point(hardware, topology, batch, kv, t_lo + (batch - lo) * (t_hi - t_lo), overlap)


def batch_at_speed(hardware: str, user_tok_s: float, scale=None, tabs=None, overlap="dbo") -> Point:
    """Check A: the batch per GPU at which the composed step runs at `user_tok_s` per user (the step
    grows with the batch; bisection over whole batches, then linear between them)."""
    tabs = tabs or tables(hardware)
    target = 1e3 / user_tok_s
    lo, hi = 1, 512
    if step_ms(hardware, TOPOLOGY, lo, KV_TOKENS, overlap=overlap, scale=scale, tabs=tabs) > target:
        return point(hardware, TOPOLOGY, lo, KV_TOKENS, overlap, scale, tabs)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if step_ms(hardware, TOPOLOGY, mid, KV_TOKENS, overlap=overlap, scale=scale, tabs=tabs) <= target:
            lo = mid
        else:
            hi = mid
    t_lo = step_ms(hardware, TOPOLOGY, lo, KV_TOKENS, overlap=overlap, scale=scale, tabs=tabs)
    t_hi = step_ms(hardware, TOPOLOGY, hi, KV_TOKENS, overlap=overlap, scale=scale, tabs=tabs)
    b = lo + (target - t_lo) / (t_hi - t_lo) if t_hi > t_lo else float(lo)
    return Point(hardware, TOPOLOGY, b, KV_TOKENS, target, overlap)


def err(pred: float, pub: float) -> float:
    return pred / pub - 1.0


@dataclass(frozen=True)
class Report:
    # keyed by (hardware, attention source): ATTENTION (DeepSeek's kernels) and None (vLLM's, the sensitivity)
    check_a: dict  # -> Point (batch at 21 tok/s per user)
    check_b: dict  # -> Point (at 88 requests per GPU)
    profile_data: dict  # -> Point
    parts: dict  # -> {part: ms per step at check B's batch}
    sensitivity: list  # (what, factor, per-GPU error at check A, per-GPU error at check B), on H800 with ATTENTION


def step_parts(hardware: str, batch: int, tabs) -> dict:
    """Check B's step split by part, each summed as if run alone (no overlap), ms per step."""
    m = load_model(MODEL)
    topo = parse_topology(TOPOLOGY)
    out: dict = {}
    pr = ScaledPricer(tabs, hardware)
    for op in step_ops(m, topo, hardware, batch, kv=KV_TOKENS, q=1, batch=batch, moe_chunk=0):
        v = priced_total(m, topo, hardware, [op], pr)
        out[part_of(op)] = out.get(part_of(op), 0.0) + v
    return out


def core_tflop_per_step(batch: float) -> float:
    """The MLA core's FLOPs in one decode step of `batch` requests at KV_TOKENS (FlashMLA's count), TFLOP."""
    m = load_model(MODEL)
    return batch * m.layers * m.heads * KV_TOKENS * (m.kv_lora_rank + m.rope_dim + m.kv_lora_rank) * 2 / 1e12


SENSITIVITY = (
    ("all-to-all time (a2a bandwidth)", dict(a2a=1.25)),
    ("all-to-all time (a2a bandwidth)", dict(a2a=0.8)),
    ("routed + shared expert GEMMs", dict(experts=1.25)),
    ("routed + shared expert GEMMs", dict(experts=0.8)),
    ("MLA core (FlashMLA) at KV 4,989", dict(mla_core=1.25)),
    ("MLA core (FlashMLA) at KV 4,989", dict(mla_core=0.8)),
    ("attention projections (q, kv, o, absorbed)", dict(projections=1.25)),
    ("attention projections (q, kv, o, absorbed)", dict(projections=0.8)),
    ("router, LM head, norms, embedding", dict(other=1.25)),
)
SOURCES = (ATTENTION, None)


def run(sensitivity: bool = True) -> Report:
    a, b, pd, parts = {}, {}, {}, {}
    b_batch = PUBLISHED_GPU_TOK_S / USER_TOK_S
    for src in SOURCES:
        for hw in HARDWARE:
            tabs = tables(hw, src)
            a[hw, src] = batch_at_speed(hw, USER_TOK_S, tabs=tabs)
            b[hw, src] = point(hw, TOPOLOGY, b_batch, KV_TOKENS, tabs=tabs)
            pd[hw, src] = point(hw, PROFILE_DATA["topology"], PROFILE_DATA["batch"], PROFILE_DATA["kv"], tabs=tabs)
            parts[hw, src] = step_parts(hw, round(b_batch), tabs)
    sens = []
    if sensitivity:
        tabs = tables("h800")

        def row(what, factor, scale=None, kern=tabs, overlap="dbo"):
            pa = batch_at_speed("h800", USER_TOK_S, scale=scale, tabs=kern, overlap=overlap)
            pb = point("h800", TOPOLOGY, b_batch, KV_TOKENS, overlap, scale, kern)
            sens.append((what, factor, err(pa.gpu_tok_s, PUBLISHED_GPU_TOK_S), err(pb.gpu_tok_s, PUBLISHED_GPU_TOK_S)))

        for what, sc in SENSITIVITY:
            row(what, f"x {next(iter(sc.values())):g}", sc)
        row(
            "FlashMLA at its 2025-02 release rate",
            f"{FLASHMLA_H800_TFLOPS_FEB_2025:g} TFLOP/s",
            kern=tables("h800", tflops=FLASHMLA_H800_TFLOPS_FEB_2025),
        )
        for ov in (0.5, 0.0):
            row("two-batch overlap efficiency (1: the schedule's)", f"{ov:g}", overlap=ov)
    return Report(a, b, pd, parts, sens)


def format_report(r: Report) -> str:
    out = [
        f"DeepSeek-V3 decode, {TOPOLOGY} (EP144, 288 routed experts = 256 + 32 redundant, 2 per GPU), two-batch "
        f"overlap, KV {KV_TOKENS:,} per request; MLA decode core from {ATTENTION} (DeepSeek's FlashMLA at its "
        f"README's H800 rates), everything else from {SOURCE_TABLE} (carried per op to H800 / H100) and {A2A_TABLE}; "
        "beside it, the attention as vLLM's MLA module from the same AIC table",
        f"published (open-infra-index day 6, H800): {PUBLISHED_GPU_TOK_S:,.0f} output tok/s per GPU "
        f"({PUBLISHED_NODE_TOK_S:,.0f} per node), {PUBLISHED_USER_TOK_S[0]:g}-{PUBLISHED_USER_TOK_S[1]:g} tok/s per user",
        "",
        f"A. at {USER_TOK_S:g} tok/s per user (input): batch per GPU, per-GPU throughput vs {PUBLISHED_GPU_TOK_S:,.0f}",
        "| hardware | MLA attention | batch/GPU | step ms | tok/s/GPU | error |",
        "|---|---|---|---|---|---|",
    ]
    for (hw, src), p in r.check_a.items():
        e = err(p.gpu_tok_s, PUBLISHED_GPU_TOK_S)
        out.append(
            f"| {hw.upper()} | {ATTENTION_LABEL[src]} | {p.batch:.1f} | {p.step_ms:.1f} | {p.gpu_tok_s:,.0f} | {e:+.1%} |"
        )
    bb = PUBLISHED_GPU_TOK_S / USER_TOK_S
    out += [
        "",
        f"B. at {bb:.1f} requests per GPU ({PUBLISHED_GPU_TOK_S:,.0f} / {USER_TOK_S:g}, input): per-user speed vs "
        f"{PUBLISHED_USER_TOK_S[0]:g}-{PUBLISHED_USER_TOK_S[1]:g}, per-GPU throughput vs {PUBLISHED_GPU_TOK_S:,.0f}",
        "| hardware | MLA attention | step ms | tok/s/user | tok/s/GPU | error |",
        "|---|---|---|---|---|---|",
    ]
    for (hw, src), p in r.check_b.items():
        e = err(p.gpu_tok_s, PUBLISHED_GPU_TOK_S)
        out.append(
            f"| {hw.upper()} | {ATTENTION_LABEL[src]} | {p.step_ms:.1f} | {p.user_tok_s:.1f} | {p.gpu_tok_s:,.0f} "
            f"| {e:+.1%} |"
        )
    out += [
        "",
        f"Step parts at check B ({round(bb)} requests per GPU; ms per step, each as if alone, without the overlap "
        "that hides the all-to-all; vLLM's module includes its projections):",
        "| hardware | MLA attention | MLA core | projections | experts (routed + shared) | all-to-all | other |",
        "|---|---|---|---|---|---|---|",
    ]
    for (hw, src), ps in r.parts.items():
        proj = f"{ps['projections']:.1f}" if ps.get("projections") else "in the module"
        out.append(
            f"| {hw.upper()} | {ATTENTION_LABEL[src]} | {ps.get('mla_core', 0):.1f} | {proj} | {ps.get('experts', 0):.1f} "
            f"| {ps.get('a2a', 0):.1f} | {ps.get('other', 0):.1f} |"
        )
    out.append("")
    tf = core_tflop_per_step(round(bb))
    fl = r.parts["h800", ATTENTION]["mla_core"]
    vl = r.parts["h800", None]["mla_core"]
    out.append(
        f"MLA core FLOPs at check B: {tf:.2f} TFLOP per step; H800: FlashMLA's core {fl:.1f} ms "
        f"({tf / fl * 1e3:.0f} TFLOP/s), vLLM's module {vl:.1f} ms with its projections ({tf / vl * 1e3:.0f} TFLOP/s, a "
        f"lower bound on its core's rate; less the projections as FlashMLA's composition prices them, "
        f"{r.parts['h800', ATTENTION]['projections']:.1f} ms: {vl - r.parts['h800', ATTENTION]['projections']:.1f} ms)"
    )
    out += [
        "",
        f"profile-data configuration ({PROFILE_DATA['topology']}, {PROFILE_DATA['batch']} requests per GPU, KV "
        f"{PROFILE_DATA['kv']:,}; no published timing read):",
        "| hardware | MLA attention | step ms | tok/s/user | tok/s/GPU |",
        "|---|---|---|---|---|",
    ]
    for (hw, src), p in r.profile_data.items():
        out.append(
            f"| {hw.upper()} | {ATTENTION_LABEL[src]} | {p.step_ms:.1f} | {p.user_tok_s:.1f} | {p.gpu_tok_s:,.0f} |"
        )
    if r.sensitivity:
        out += [
            "",
            "Sensitivity on H800 with FlashMLA (one input changed; per-GPU error at A and at B):",
            "| input | factor | error A | error B |",
            "|---|---|---|---|",
        ]
        for what, f, ea, eb in r.sensitivity:
            out.append(f"| {what} | {f} | {ea:+.1%} | {eb:+.1%} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--no-sensitivity", action="store_true")
    a = ap.parse_args()
    print(format_report(run(sensitivity=not a.no_sensitivity)))


if __name__ == "__main__":
    main()
