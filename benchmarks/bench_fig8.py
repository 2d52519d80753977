"""The DSpark paper's Fig. 8 alone: throughput per GPU and verify budget vs concurrency per GPU.

MTP-1 vs DSpark-5 adaptive (the deepseek-v4 acceptance preset for both), closed loop, at
per-GPU concurrency levels on the paper's axis; prints per level dsim's and the paper's
throughput per GPU (the paper's fitted lines, read from the figure), their DSpark / MTP-1 ratio,
and DSpark's verify tokens per request (MTP-1: 2). The full Sec. 5.4 comparison (Fig. 7's
frontier gains as well) is benchmarks/bench_paper.py; this is its Fig. 8 part on one case.

With --scan N,N,...: the verify budget against the step-cost curve instead. One decode instance
(one replica) runs exactly N requests at a time (N users, 1100-token prompts already prefilled,
400 output tokens each, the deepseek-v4 classes drawn equally), DSpark-5 adaptive on bench_paper's
engine (scheduling overlapped, policy paper-production); printed per N:
the verify tokens per request, the tokens per step they make, the profile's forward time there
and its marginal cost per token (the slope over +-32 tokens), which is what the budget policy
weighs an extra verified draft against.

With --breakdown T,T,...: where a composed forward of T tokens per rank goes, per part of the
model (routed experts with their lockstep factor, all-to-all, attention, ...), priced by
dsim.profiling.pricer from the kernel tables of --kernels for --model on --hardware and --topology; with
two-batch overlap where the split is faster (dsim.profiling.overlap.forward_ms_dbo, no layer glue); and a
what-if: the MoE block (routed experts, dispatch, combine) replaced by DeepSeek's published Mega MoE
time for the model at EP8 (DeepGEMM pull request 304 / 316, April 2026: dispatch, both expert
GEMMs, SwiGLU and combine fused into one kernel that overlaps the NVLink transfers with the tensor
cores, FP8 x FP4 only, so a Blackwell-class GPU; measured at 1, 512, 8192 and 32768 tokens per
rank, averaged over the 8 ranks), interpolated log-log and linearly between its points (the
range printed), the rest of the forward as composed. It mixes hardware on purpose: it asks how
the step would grow with tokens if the MoE block cost what DeepSeek's own V4 kernel costs inside
one NVLink domain, with everything else as dsim prices it.

With --per-token A,B: what one more verify token costs on one GPU, per part of the model, as the
marginal cost between forwards of A and B tokens per rank (unsplit, MoE in the composer's chunks),
beside the same part's FLOPs at the GPU's dense peak (bf16 / fp8 per the op's dtype; attention
cores over their V4 key lists at 1024 tokens of context: the 128-token window, plus index_topk
compressed entries on CSA layers and context / 128 on HCA layers, and the lightning indexer over
context / 4), so the gap between the kernel tables and the hardware's floor is per part; then
DSpark's drafter (three MoE layers over block x requests positions, flattened attention, the LM
head over every position) at --drafter-requests, by part, unsplit as the profiles price it and
on the two-micro-batch schedule of the target's layers (a what-if: dsim.profiling.overlap.dbo_layer_ms
over the drafter's layers).

With --network-floor: the per-GPU all-to-all bandwidth the paper's own Fig. 8 points need on a
deployment with one routed expert per GPU (the paper scenario's), if the step did nothing but move
its tokens' MoE bytes through the GPU's NIC one way (dsim.study.frontier.network_floor): no compute,
no drafter, no latency, perfect overlap. MTP-1 verifies 2 tokens per request and emits the
preset's tau; DSpark verifies the paper's Fig. 8 budget and is credited with the preset's tau of
the whole 5-token block (the most it could emit, so the bandwidth shown is a lower bound) and,
beside it, the static prefix tau at that budget. Printed against the 400 Gb/s NIC's 50 GB/s line
rate and the 39-43 GB/s per GPU DeepEP's README measures for its low-latency kernels from EP64 on.

Usage: python benchmarks/bench_fig8.py [--profile NAME] [--trace default] [--disaggregated]
       [--per-gpu 10,20,50,100,150,200] [--requests-per-user 16] [--jobs N]
       python benchmarks/bench_fig8.py [--profile NAME] --scan 10,20,50,100,150,200
       python benchmarks/bench_fig8.py --network-floor
       python benchmarks/bench_fig8.py --per-token 400,800 --topology dp256-ep256 --kernels ...
       python benchmarks/bench_fig8.py --breakdown 1,40,200,400 [--model deepseek-v4-flash]
              [--hardware h200] [--kernels h200-aic-vllm,h200-torch] [--topology dp8-ep8]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_paper as B


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default=B.PAPER_PROFILES[0], help="default: the paper scenario's V4-Flash profile")
    ap.add_argument("--trace", default="default")
    ap.add_argument(
        "--disaggregated",
        action="store_true",
        help="decode instances of a prefill/decode-disaggregated deployment (see bench_paper)",
    )
    ap.add_argument("--remote-prefill-ms", type=float, default=0.0)
    ap.add_argument("--remote-prefill-ms-per-ktok", type=float, default=0.0)
    ap.add_argument("--per-gpu", default="10,20,50,100,150,200")
    ap.add_argument("--requests-per-user", type=int, default=16)
    ap.add_argument("--min-requests", type=int, default=200)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--mix", default=None)
    ap.add_argument("--acceptance", default=None)
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--scan", default=None, help="running batch sizes per decode instance (see above)")
    ap.add_argument("--breakdown", default=None, help="forward sizes in tokens (see above)")
    ap.add_argument("--network-floor", action="store_true", help="the bandwidth Fig. 8's points need (see above)")
    ap.add_argument("--model", default="deepseek-v4-flash")
    ap.add_argument("--hardware", default="h200")
    ap.add_argument("--kernels", default="h200-aic-vllm,h200-torch")
    ap.add_argument("--topology", default="dp8-ep8")
    ap.add_argument("--prefer", default="", help="op=TABLE,...: as dsim profile compose profile --prefer")
    ap.add_argument("--per-token", default=None, help="A,B: marginal cost per verify token (see above)")
    ap.add_argument("--drafter-requests", default="100,200", help="--per-token: drafter sizes in requests")
    ap.add_argument("--draft-block", type=int, default=5, help="--per-token: DSpark's block (the paper's 5)")
    a = ap.parse_args(argv)
    if a.per_token:
        prefer = dict(x.strip().split("=", 1) for x in a.prefer.split(",") if x.strip())
        lo, hi = (int(x) for x in a.per_token.split(","))
        return per_token(
            a.model,
            a.hardware,
            a.kernels,
            a.topology,
            lo,
            hi,
            prefer,
            [int(x) for x in a.drafter_requests.split(",")],
            a.draft_block,
        )
    if a.network_floor:
        return network_floor_table(a.acceptance or "deepseek-v4")
    if a.breakdown:
        prefer = dict(x.strip().split("=", 1) for x in a.prefer.split(",") if x.strip())
        return breakdown(a.model, a.hardware, a.kernels, a.topology, [int(x) for x in a.breakdown.split(",")], prefer)
    if a.scan:
        return scan(a.profile, [int(x) for x in a.scan.split(",")])
    a.csv_dir = None
    a.no_static = True
    r = B.run_case(
        a.profile,
        a.trace,
        [int(x) for x in a.per_gpu.split(",")],
        a,
        variant="disaggregated" if a.disaggregated else "colocated",
    )
    P = B.PAPER[r["key"]]
    df = r["df"]
    mt = df[df.method == "mtp"].set_index("concurrency_per_gpu")
    ds = df[df.method == "dspark"].set_index("concurrency_per_gpu")
    print(f"profile : {r['profile'].label}")
    print(f"workload: {r['workload']}")
    print(f"paper   : {P['model']}, Fig. 8 fitted lines")
    print(
        f"{'C/GPU':>6} {'MTP-1 tok/s/GPU':>16} {'paper':>7} {'DSpark tok/s/GPU':>17} {'paper':>7} "
        f"{'ratio':>6} {'paper':>6} {'DSpark verify':>14} {'paper':>6} {'MTP verify':>11}"
    )
    for c in sorted(set(mt.index) & set(ds.index)):
        pm = B._interp_loglog(c, P["fig8_c"], P["fig8_mtp"])
        pd_ = B._interp_loglog(c, P["fig8_c"], P["fig8_dspark"])
        pb = B._interp_loglog(c, P["fig8_c"], P["fig8_budget"])
        m, d = mt.loc[c, "output_tok_s_per_gpu"], ds.loc[c, "output_tok_s_per_gpu"]
        print(
            f"{c:>6g} {m:>16.0f} {B._num(pm):>7} {d:>17.0f} {B._num(pd_):>7} {d / m:>5.2f}x "
            f"{(f'{pd_ / pm:.2f}x' if pm and pd_ else 'n/a'):>6} {ds.loc[c, 'verify_tokens_per_request']:>14.2f} "
            f"{B._num(pb, 2):>6} {mt.loc[c, 'verify_tokens_per_request']:>11.2f}"
        )
    print(f"sweep took {r['wall_s']:.1f} s")


#: DeepGEMM pull request 316 (DeepSeek, 2026-04-24), "Mega MoE benchmarks": one MoE layer (dispatch,
#: linear 1, SwiGLU, linear 2, combine fused; no shared expert) under EP8, time per layer in us at
#: tokens per rank, averaged over the 8 ranks
MEGA_MOE_EP8_US = {
    "deepseek-v4-flash": ((1, 56.5), (512, 146.5), (8192, 1283.1), (32768, 4855.5)),
    "deepseek-v4-pro": ((1, 108.1), (512, 369.6), (8192, 2818.5), (32768, 10655.2)),
}


def mega_moe_us(model_name: str, n: float) -> tuple[float, float] | None:
    """(log-log, linear) interpolation of the published Mega MoE time per layer at n tokens per rank;
    None outside the published span or for another model."""
    pts = MEGA_MOE_EP8_US.get(model_name)
    if not pts or not pts[0][0] <= n <= pts[-1][0]:
        return None
    import math

    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 <= n <= x1:
            f_lin = (n - x0) / (x1 - x0)
            f_log = (math.log(n) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return math.exp(math.log(y0) + f_log * (math.log(y1) - math.log(y0))), y0 + f_lin * (y1 - y0)
    return None


def breakdown(model_name, hardware, kernels, topology, sizes, prefer=None):
    from collections import defaultdict

    from dsim.profiling.compose import VLLM_MOE_DP_CHUNK
    from dsim.profiling.forward import GRAPH_GAP_US_PER_LAYER, forward_ms
    from dsim.profiling.kernel_ops import step_ops
    from dsim.profiling.kernel_tables import Roofline, load_kernel_table
    from dsim.profiling.models import load_model
    from dsim.profiling.overlap import A2A_KINDS, forward_ms_dbo
    from dsim.profiling.pricer import Pricer, _moe_factor
    from dsim.profiling.topology import parse_topology

    model = load_model(model_name)
    topo = parse_topology(topology)
    pricer = Pricer(
        [load_kernel_table(k.strip()) for k in kernels.split(",") if k.strip()],
        Roofline(hardware=hardware),
        prefer=prefer or None,
    )
    # the MoE block in vLLM's DP chunks, as compose_profile prices it on data-parallel topologies
    chunk = VLLM_MOE_DP_CHUNK if topo.attn_dp > 1 else 0
    print(
        f"{model_name} {topology} on {hardware}, kernels {kernels}; {model.layers} layers; ms per forward"
        + (f" (MoE in chunks of {chunk} tokens per rank)" if chunk else "")
    )
    for n in sizes:
        parts = defaultdict(float)
        for op in step_ops(model, topo, hardware, n, moe_chunk=chunk):
            v = op.count * pricer.ms(op)
            if op.part == "moe_experts":  # the slowest EP rank's experts (the composer's factor)
                v *= _moe_factor(model, topo, hardware, op, pricer.roofline)
            parts[op.part] += v
        gaps = model.layers * GRAPH_GAP_US_PER_LAYER * 1e-3
        total = sum(parts.values()) + gaps
        main = sorted(parts.items(), key=lambda kv: -kv[1])
        shown = ", ".join(f"{k} {v:.1f} ({100 * v / total:.0f}%)" for k, v in main[:4])
        rest = total - sum(v for _, v in main[:4])
        print(f"{n:>6} tokens: {total:6.1f} ms = {shown}, rest {rest:.1f}")
        if topo.attn_dp > 1 and n >= 2:
            split = forward_ms_dbo(model, topo, hardware, n, pricer, 10**9, threshold=2, moe_chunk=chunk)
            unsplit = forward_ms(model, topo, hardware, n, pricer, 10**9, moe_chunk=chunk)
            print(
                f"{'':>14}two-batch overlap: {min(split, unsplit):6.1f} ms"
                + (" (split)" if split < unsplit else " (not split: no faster)")
            )
        mm = mega_moe_us(model_name, n)
        if mm is not None:
            moe_layers = sum(model.moe_layer)
            a2a = sum(
                op.count * pricer.ms(op)
                for op in step_ops(model, topo, hardware, n, moe_chunk=chunk)
                if op.part == "comm" and op.rec.get("kind") in A2A_KINDS
            )
            base = total - parts["moe_experts"] - a2a
            lo, hi = sorted(base + moe_layers * us * 1e-3 for us in mm)
            print(
                f"{'':>14}MoE block at Mega MoE's EP8 time: {lo:6.1f}-{hi:.1f} ms "
                f"({moe_layers} x {min(mm):.0f}-{max(mm):.0f} us in place of experts + all-to-all "
                f"{parts['moe_experts'] + a2a:.1f} ms)"
            )


def op_flops(model, rec, kv=1024):
    """(FLOPs, math dtype) of one op record on one GPU; 0 for ops that move bytes only."""
    if rec["op"] == "gemm":
        return 2.0 * rec["m"] * rec["n"] * rec["k"] * rec.get("groups", 1), rec["dtype"]
    if rec["op"] == "moe":  # the rows routed to this GPU's experts: tokens x top-k / EP ranks
        return rec["tokens"] * rec["topk"] / rec["ep"] * 3 * rec["hidden"] * rec["inter"] * 2.0, rec["dtype"]
    if rec["op"] == "attn" and str(rec["kind"]).startswith("v4_"):
        from dsim.profiling.executor_terms import _key_width

        keys = model.sliding_window + _key_width(model, rec["kind"], kv + rec["q"])
        f = rec["batch"] * rec["q"] * rec["heads"] * keys * 2 * model.head_dim * 2.0  # QK and PV
        if rec["kind"] == "v4_csa":  # the lightning indexer scores the ratio-4 compressed keys
            f += rec["batch"] * rec["q"] * model.index_heads * (kv // 4) * model.index_dim * 2.0
        return f, "bf16"
    return 0.0, "bf16"


def per_token(model_name, hardware, kernels, topology, lo, hi, prefer, drafter_requests, block):
    from collections import defaultdict

    from dsim.profiling.compose import VLLM_MOE_DP_CHUNK
    from dsim.profiling.drafters import draft_ops
    from dsim.profiling.forward import GRAPH_GAP_US_PER_LAYER
    from dsim.profiling.kernel_ops import step_ops
    from dsim.profiling.kernel_tables import HARDWARE, Roofline, load_kernel_table
    from dsim.profiling.models import load_model
    from dsim.profiling.overlap import dbo_layer_ms, micro_batch_layer
    from dsim.profiling.pricer import Pricer, _moe_factor
    from dsim.profiling.topology import parse_topology

    model = load_model(model_name)
    topo = parse_topology(topology)
    hw = HARDWARE[hardware]
    pricer = Pricer(
        [load_kernel_table(k.strip()) for k in kernels.split(",") if k.strip()],
        Roofline(hardware=hardware),
        prefer=prefer or None,
    )
    chunk = VLLM_MOE_DP_CHUNK if topo.attn_dp > 1 else 0

    def parts(ops):
        ms, fl = defaultdict(float), defaultdict(float)
        for op in ops:
            v = op.count * pricer.ms(op)
            if op.part == "moe_experts":
                v *= _moe_factor(model, topo, hardware, op, pricer.roofline)
            # parts an attention module's records include (projections) are priced inside it
            key = (
                "all-to-all"
                if op.part == "comm"
                else "attention"
                if op.part in pricer.skip | {"attn_core"}
                else op.part
            )
            ms[key] += v
            f, dt = op_flops(model, op.rec)
            peak = hw["fp8"] if dt == "fp8" else hw["bf16"]
            fl[key] += op.count * f / peak * 1e3  # ms at the dense peak
        return ms, fl

    a_ms, a_fl = parts(step_ops(model, topo, hardware, lo, moe_chunk=chunk))
    b_ms, b_fl = parts(step_ops(model, topo, hardware, hi, moe_chunk=chunk))
    d = hi - lo
    print(
        f"{model_name} {topology} on {hardware}, kernels {kernels}: us per verify token between {lo} and {hi} "
        f"tokens per rank (unsplit; MoE in chunks of {chunk}), and at the {hw['name']}'s dense peak"
    )
    rows = sorted(b_ms, key=lambda k: -(b_ms[k] - a_ms.get(k, 0.0)))
    tot = tot_fl = 0.0
    for k in rows:
        us, us_fl = (b_ms[k] - a_ms.get(k, 0.0)) / d * 1e3, (b_fl[k] - a_fl.get(k, 0.0)) / d * 1e3
        if abs(us) < 0.05 and us_fl < 0.05:
            continue
        print(f"  {k:16s} {us:7.1f} us   at peak {us_fl:5.1f} us" + (f"   ({us / us_fl:.1f}x)" if us_fl > 0.05 else ""))
        if k != "all-to-all":
            tot, tot_fl = tot + us, tot_fl + us_fl
    comm = (b_ms["all-to-all"] - a_ms.get("all-to-all", 0.0)) / d * 1e3
    print(
        f"  compute          {tot:7.1f} us   at peak {tot_fl:5.1f} us   ({tot / tot_fl:.1f}x); all-to-all {comm:.1f} us"
    )
    swa = [i for i, k in enumerate(model.attn_kinds) if k in ("v4_swa", "mla")][:1] or [model.layers - 1]
    for R in drafter_requests:
        n = R * block
        ms, _ = parts(draft_ops(model, topo, hardware, "dspark", R, block, chunk, True))
        unsplit = sum(ms.values()) + 3 * GRAPH_GAP_US_PER_LAYER * 1e-3
        halves = (-(-n // 2), n // 2)
        mbs = [micro_batch_layer(model, topo, hardware, h, pricer, swa[0], moe_chunk=chunk) for h in halves]
        lm = ms["lm_head"]
        split = 3 * (dbo_layer_ms(mbs[0], mbs[1]) + 2 * GRAPH_GAP_US_PER_LAYER * 1e-3) + lm
        shown = ", ".join(f"{k} {v:.2f}" for k, v in sorted(ms.items(), key=lambda kv: -kv[1]) if v >= 0.01)
        print(
            f"  DSpark drafter, {R} requests x {block} positions: {unsplit:.2f} ms unsplit ({shown}); "
            f"{split:.2f} ms on the two-micro-batch schedule (what-if)"
        )


#: DeepEP README, low-latency kernels (H800, one CX7 400 Gb/s NIC per GPU, 128 tokens per rank):
#: the bandwidth per GPU it reports from EP64 on, GB/s (dispatch and combine, EP64..EP256)
DEEPEP_LL_GB_S = (39.0, 43.0)
CX7_LINE_GB_S = 50.0


def prefix_tau(acc, budget):
    """Equal-mix tau of verifying the first budget - 1 drafts in order, linear between integers."""
    import numpy as np

    classes = ("math", "code", "chat")
    k = budget - 1.0
    lo, hi = int(np.floor(k)), int(np.ceil(k))
    t = [np.mean([acc.tau(c, j) for c in classes]) for j in (lo, hi)]
    return t[0] + (t[1] - t[0]) * (k - lo)


def network_floor_table(preset):
    import numpy as np

    from dsim.profiling.models import load_model
    from dsim.spec.acceptance import load_acceptance
    from dsim.study.frontier import a2a_bytes_per_token, network_floor

    acc_m, acc_d = load_acceptance(preset, "mtp"), load_acceptance(preset, "dspark")
    classes = ("math", "code", "chat")
    tau_m = float(np.mean([acc_m.tau(c, 1) for c in classes]))
    tau_block = float(np.mean([acc_d.tau(c, 5) for c in classes]))
    print(
        f"acceptance {preset}: MTP-1 tau {tau_m:.2f}, DSpark-5 whole-block tau {tau_block:.2f}; "
        f"NIC: 400 Gb/s line {CX7_LINE_GB_S:.0f} GB/s, DeepEP low-latency measured "
        f"{DEEPEP_LL_GB_S[0]:.0f}-{DEEPEP_LL_GB_S[1]:.0f} GB/s per GPU"
    )
    for key, model_name in (("flash", "deepseek-v4-flash"), ("pro", "deepseek-v4-pro")):
        P = B.PAPER[key]
        m = load_model(model_name)
        bpt = a2a_bytes_per_token(m.hidden, m.topk, sum(m.moe_layer))
        print(
            f"{P['model']}: {bpt / 1e6:.2f} MB per token one way over {sum(m.moe_layer)} MoE layers "
            f"(top-{m.topk}, hidden {m.hidden}); Fig. 8 fitted lines"
        )
        print(
            f"{'C/GPU':>6} {'method':>7} {'tok/s/GPU':>10} {'verify':>7} {'tau':>5} {'step ms':>8} "
            f"{'needs GB/s':>11} {'(static prefix tau)':>20}"
        )
        for c, thr_m, thr_d, b in zip(P["fig8_c"], P["fig8_mtp"], P["fig8_dspark"], P["fig8_budget"]):
            f = network_floor("mtp", c, thr_m, B.MTP_VERIFY, tau_m, bpt)
            print(
                f"{c:>6g} {'MTP-1':>7} {thr_m:>10.0f} {f.verify_tokens_per_request:>7.2f} {f.tau:>5.2f} "
                f"{f.step_ms:>8.1f} {f.required_gb_s:>11.1f}"
            )
            if b is None:
                continue
            f = network_floor("dspark", c, thr_d, b, tau_block, bpt)
            g = network_floor("dspark", c, thr_d, b, prefix_tau(acc_d, b), bpt)
            print(
                f"{c:>6g} {'DSpark':>7} {thr_d:>10.0f} {b:>7.2f} {f.tau:>5.2f} {f.step_ms:>8.1f} "
                f"{f.required_gb_s:>11.1f} {f'{g.required_gb_s:.1f} at tau {g.tau:.2f}':>20}"
            )
        layout_variants(P, m, acc_d, tau_m)
    return 0


def layout_variants(P, m, acc_d, tau_m):
    """The same Fig. 8 points under other all-to-all layouts (the paper names none): GB/s per GPU
    one way for MTP-1 and for DSpark at the preset's prefix tau."""
    from dsim.study.frontier import FP8_SCALE_BLOCK, a2a_bytes_per_token, network_floor, remote_copies

    L = sum(m.moe_layer)
    fp8 = 1.0 + 4.0 / FP8_SCALE_BLOCK  # FP8 values and one fp32 scale per 128
    layouts = [
        (f"EP{m.experts}, BF16 combine (dsim)", m.topk, 2.0),
        (f"EP{m.experts}, FP8 combine", m.topk, fp8),
        (f"EP{m.experts}, 10-bit combine", m.topk, 1.25),
        ("EP64 + node dedupe, BF16", remote_copies(m.topk, m.experts, 8, True), 2.0),
        ("EP32 + node dedupe, BF16", remote_copies(m.topk, m.experts, 4, True), 2.0),
        ("EP32 + node dedupe, FP8", remote_copies(m.topk, m.experts, 4, True), fp8),
    ]
    print(
        f"{P['model']}: GB/s per GPU by layout (MTP-1 / DSpark at the preset's prefix tau), "
        "8 GPUs a node, routed experts spread evenly"
    )
    print(f"{'layout':>30} {'copies':>7} {'MB/token':>9} " + " ".join(f"{f'C {c:g}':>13}" for c in P["fig8_c"][1:]))
    for name, copies, cb in layouts:
        bpt = a2a_bytes_per_token(m.hidden, m.topk, L, combine_bytes=cb, copies=copies)
        cells = []
        for c, thr_m, thr_d, b in list(zip(P["fig8_c"], P["fig8_mtp"], P["fig8_dspark"], P["fig8_budget"]))[1:]:
            fm = network_floor("mtp", c, thr_m, B.MTP_VERIFY, tau_m, bpt)
            fd = network_floor("dspark", c, thr_d, b, prefix_tau(acc_d, b), bpt)
            cells.append(f"{fm.required_gb_s:.0f} / {fd.required_gb_s:.0f}")
        print(f"{name:>30} {copies:>7.2f} {bpt / 1e6:>9.2f} " + " ".join(f"{x:>13}" for x in cells))


def scan(profile, batches):
    import numpy as np

    from dsim.cost import CostModel, load_profile
    from dsim.engine.config import EngineConfig
    from dsim.sim import SimConfig, SpecConfig, simulate
    from dsim.workload import Workload

    prof = load_profile(profile)
    c = CostModel(prof)
    print(f"profile : {prof.label}")
    print(
        f"{'N':>5} {'verify/request':>15} {'tokens/step':>12} {'forward ms':>11} {'marginal us/token':>18} {'tau':>5}"
    )
    for n in batches:
        w = Workload(
            arrival_s=np.zeros(n),
            prompt_tokens=np.full(n, 1100),
            output_tokens=np.full(n, 400),
            cls=(np.arange(n) % 3).astype(np.int16),
            class_names=("math", "code", "chat"),
            session_id=np.full(n, -1),
            closed_loop_concurrency=None,
            source="scan",
        )
        s = simulate(
            SimConfig(
                workload=w,
                profile=prof,
                gpus_per_node=prof.gpus_per_replica,
                engine=EngineConfig(kv_role="kv_consumer", async_scheduling=True),
                spec=SpecConfig("dspark", k=5, adaptive=True, policy="paper-production"),
            )
        ).summary
        v = s["mean_verify_tokens_per_request"]
        t = int(round(n * v))
        slope = (c.forward_ms(t + 32) - c.forward_ms(max(t - 32, 1))) / (t + 32 - max(t - 32, 1)) * 1000
        print(f"{n:>5} {v:>15.2f} {t:>12} {c.forward_ms(t):>11.1f} {slope:>18.0f} {s['acceptance_length']:>5.2f}")


if __name__ == "__main__":
    main()
