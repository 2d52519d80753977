"""The routed experts of an EP rank holding ONE expert, timed as a decode engine with DeepEP's low-latency
layout runs them, next to the pieces of validator.gpu.moe_gemm's grouped op (MoEOp).

    python3 validator/gpu/scripts/one_expert_chain.py --out one-expert-chain.json [--dry-run]

DeepEP's low-latency dispatch delivers each local expert's tokens already in expert order, in FP8 with
1 x 128 block scales, and its combine applies the routing weights, so one expert's FFN is three kernels:
gate+up GEMM, SwiGLU with its FP8 re-quantization, down GEMM (SGLang's DeepEP low-latency MoE path,
for one: DeepGEMM's masked grouped GEMMs around a fused SiLU-and-mul-and-quantize kernel). Variants per
row count (rows = tokens per rank x top-k, one expert per rank):

- lean: block-scaled FP8 GEMMs (torch.nn.functional.scaled_mm, 1 x 128 activation / 128 x 128 weight
  blocks, as the h200-torch GEMM records) around one fused Triton kernel (clamped SwiGLU in fp32 and
  the 1 x 128 block quantization of its output);
- gemms: the two GEMMs alone (what the lean chain's elementwise kernel adds is lean - gemms);
- grouped: validator.gpu.moe_gemm.MoEOp for the same rows (permutation, torch._scaled_grouped_mm,
  SwiGLU and quantization as separate torch kernels, routing weights and scatter), as the
  h200-torch-wideep table's moe records were timed.

Writes "moe" kernel-table records of the lean chain (tokens = tokens per rank x experts, ep = experts,
so dsim.profiling.pricer's one-expert lookups find them) and the variants' times, after every row count. A
correctness check of the lean chain against a bf16 reference is in the output (max relative error).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

MODELS = {  # hidden, moe_inter, topk, routed experts (public config.json files)
    "deepseek-v4-flash": (4096, 2048, 6, 256),
    "deepseek-v4-pro": (7168, 3072, 6, 384),
}
TOKENS_PER_RANK = (1, 4, 16, 32, 64, 96, 128, 192, 256)
SWIGLU_LIMIT = 10.0  # config.json swiglu_limit
FP8_MAX = 448.0


def _swiglu_quant_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(h_ptr, q_ptr, s_ptr, M, INTER: tl.constexpr, LIMIT: tl.constexpr, FMAX: tl.constexpr):
        row = tl.program_id(0)
        g = tl.program_id(1)
        offs = g * 128 + tl.arange(0, 128)
        gate = tl.load(h_ptr + row * 2 * INTER + offs).to(tl.float32)
        up = tl.load(h_ptr + row * 2 * INTER + INTER + offs).to(tl.float32)
        gate = tl.minimum(gate, LIMIT)
        up = tl.minimum(tl.maximum(up, -LIMIT), LIMIT)
        a = gate / (1.0 + tl.exp(-gate)) * up
        s = tl.maximum(tl.max(tl.abs(a), axis=0), 1e-4) / FMAX
        tl.store(q_ptr + row * INTER + offs, (a / s).to(q_ptr.dtype.element_ty))
        tl.store(s_ptr + g * M + row, s)

    return kernel


class OneExpert:
    """One expert's FFN over `rows` tokens (padded to 16 for the block-scaled GEMM)."""

    def __init__(self, hidden: int, inter: int, rows: int, device):
        import torch

        self.H, self.I = hidden, inter
        self.m = -(-rows // 16) * 16
        f8 = torch.float8_e4m3fn if device.type == "cuda" else torch.bfloat16
        self.f8 = f8
        self.x = (torch.randn(self.m, hidden, device=device) * 0.5).to(f8)
        self.sx = (torch.rand(hidden // 128, self.m, device=device) + 0.5).t()  # [m, H/128], outer-dim-major
        self.w13 = (torch.randn(2 * inter, hidden, device=device) * 0.05).to(f8)
        self.w2 = (torch.randn(hidden, inter, device=device) * 0.05).to(f8)
        self.s13 = self._wscale(2 * inter, hidden, device)
        self.s2 = self._wscale(hidden, inter, device)
        self.q = torch.empty(self.m, inter, device=device, dtype=f8)
        self.sq = torch.empty(inter // 128, self.m, device=device, dtype=torch.float32)
        self.cuda = device.type == "cuda"
        self.kernel = _swiglu_quant_kernel() if self.cuda or os.environ.get("TRITON_INTERPRET") == "1" else None

    @staticmethod
    def _wscale(n: int, k: int, device):
        import torch

        L4 = -(-(k // 128) // 4) * 4
        return (torch.rand(-(-n // 128), L4, device=device) + 0.5).t()  # [L4, ceil(n/128)]

    def _gemm(self, a, sa, w, sw):
        import torch

        if not self.cuda:  # dry run: the same products in fp32, block scales applied
            n, k = w.shape
            ws = sw.t()[: -(-n // 128), : -(-k // 128)].repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
            return ((a.float() * sa.repeat_interleave(128, 1)[:, :k]) @ (w.float() * ws).t()).to(torch.bfloat16)
        import torch.nn.functional as F
        from torch.nn.functional import ScalingType, SwizzleType

        return F.scaled_mm(
            a,
            w.t(),
            sa,
            ScalingType.BlockWise1x128,
            sw,
            ScalingType.BlockWise128x128,
            SwizzleType.NO_SWIZZLE,
            SwizzleType.NO_SWIZZLE,
            None,
            torch.bfloat16,
        )

    def swiglu_quant(self, h):
        import torch

        if self.kernel is not None:
            self.kernel[(self.m, self.I // 128)](h, self.q, self.sq, self.m, self.I, SWIGLU_LIMIT, FP8_MAX)
            return self.q, self.sq.t()
        gate = h[:, : self.I].float().clamp(max=SWIGLU_LIMIT)
        up = h[:, self.I :].float().clamp(-SWIGLU_LIMIT, SWIGLU_LIMIT)
        a = (torch.nn.functional.silu(gate) * up).view(self.m, self.I // 128, 128)
        s = a.abs().amax(-1).clamp(min=1e-4) / FP8_MAX
        self.q.copy_((a / s[..., None]).view(self.m, self.I).to(self.q.dtype))
        self.sq.copy_(s.t())
        return self.q, self.sq.t()

    def lean(self):
        h = self._gemm(self.x, self.sx, self.w13, self.s13)
        q, sq = self.swiglu_quant(h)
        return self._gemm(q, sq, self.w2, self.s2)

    def gemms(self):
        self._gemm(self.x, self.sx, self.w13, self.s13)
        return self._gemm(self.q, self.sq.t(), self.w2, self.s2)

    def check(self) -> float:
        """Max relative error of the lean chain against bf16 math on the dequantized inputs."""
        import torch

        def deq(t, s, rows, cols, wblock):
            t = t.float()
            if wblock:
                s = s.t()[: -(-rows // 128), : -(-cols // 128)]
                return t * s.repeat_interleave(128, 0)[:rows].repeat_interleave(128, 1)[:, :cols]
            return t * s.repeat_interleave(128, 1)[:, :cols]

        x = deq(self.x, self.sx, self.m, self.H, False)
        w13 = deq(self.w13, self.s13, 2 * self.I, self.H, True)
        w2 = deq(self.w2, self.s2, self.H, self.I, True)
        h = x @ w13.t()
        gate = h[:, : self.I].clamp(max=SWIGLU_LIMIT)
        up = h[:, self.I :].clamp(-SWIGLU_LIMIT, SWIGLU_LIMIT)
        ref = (torch.nn.functional.silu(gate) * up) @ w2.t()
        out = self.lean().float()
        return float(((out - ref).abs().max() / ref.abs().max().clamp(min=1e-6)).item())


def _time_row(
    H: int,
    inter: int,
    k: int,
    E: int,
    n: int,
    rows: int,
    device,
    dtype,
    n_inst: int,
    dry: bool,
    grouped: bool = True,
) -> dict:
    """lean / gemms / grouped ms and the lean chain's error for one row count."""
    from validator.gpu import moe_gemm, moe_timing

    if dry:
        ex = OneExpert(H, inter, rows, device)
        ex.lean()
        ex.gemms()
        return dict(lean_ms=None, gemms_ms=None, grouped_ms=None, max_rel_err=ex.check())
    insts = [OneExpert(H, inter, rows, device) for _ in range(n_inst)]
    out: dict[str, float | None] = dict(
        lean_ms=round(moe_timing.time_instances(lambda i: insts[i].lean, device, n_inst)[0], 5),
        gemms_ms=round(moe_timing.time_instances(lambda i: insts[i].gemms, device, n_inst)[0], 5),
    )
    rec = dict(op="moe", dtype="fp8", tokens=n * E, hidden=H, inter=inter, topk=k, experts=E, ep=E)
    if not grouped:
        out["grouped_ms"] = None
        out["max_rel_err"] = round(insts[0].check(), 5)
        return out
    out["grouped_ms"] = round(
        moe_timing.time_instances(lambda i: moe_gemm.MoEOp(rec, device, dtype, seed=i), device, n_inst)[0], 5
    )
    out["max_rel_err"] = round(insts[0].check(), 5)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--dry-run", action="store_true", help="CPU, two row counts, no timing beyond one call")
    ap.add_argument("--budget-s", type=float, default=150.0, help="stop starting new row counts after this")
    ap.add_argument(
        "--tokens-per-rank",
        default=",".join(map(str, TOKENS_PER_RANK)),
        help="comma-separated tokens per rank (default: the decode range of one 256-token MoE chunk)",
    )
    ap.add_argument("--skip-grouped", action="store_true", help="time the lean chain and the GEMMs only")
    a = ap.parse_args(argv)
    try:
        tokens_per_rank = tuple(int(x) for x in a.tokens_per_rank.split(",") if x.strip())
    except ValueError:
        print(f"error: --tokens-per-rank {a.tokens_per_rank!r}: expected integers", file=sys.stderr)
        return 2
    if not tokens_per_rank or min(tokens_per_rank) < 1:
        print(f"error: --tokens-per-rank {a.tokens_per_rank!r}: expected integers >= 1", file=sys.stderr)
        return 2
    import torch

    from validator.gpu import moe_timing

    device = torch.device("cpu" if a.dry_run or not torch.cuda.is_available() else "cuda")
    t0 = time.time()
    records: list[dict] = []
    variants: list[dict] = []
    info = dict(gpu=moe_timing.gpu_line(device) if device.type == "cuda" else "cpu (dry run)", torch=torch.__version__)

    def write():
        prov = dict(
            kind="measured" if device.type == "cuda" else "dry-run",
            hardware="NVIDIA H200 SXM" if device.type == "cuda" else "cpu",
            engine="torch + Triton (validator/gpu/scripts/one_expert_chain.py)",
            engine_version=f"torch {torch.__version__}",
            date=time.strftime("%Y-%m-%d"),
            method=(
                "one routed expert's FFN as a decode engine with DeepEP's low-latency layout runs it: block-scaled "
                "FP8 gate+up GEMM (F.scaled_mm, 1x128 / 128x128 scales), one fused Triton kernel (clamped SwiGLU, "
                "fp32, 1x128 FP8 re-quantization), block-scaled FP8 down GEMM; inputs already FP8 in expert order "
                "(the dispatch's output), routing weights applied by the combine; CUDA-graph replay over rotating "
                "instances (validator.gpu.moe_timing.time_instances), median of 7 intervals"
            ),
            command="python3 validator/gpu/scripts/one_expert_chain.py --out one-expert-chain.json"
            + ("" if tokens_per_rank == TOKENS_PER_RANK else f" --tokens-per-rank {a.tokens_per_rank}")
            + (" --skip-grouped" if a.skip_grouped else ""),
            source="own measurement",
            gpu=info,
        )
        moe_timing.write_json_atomic(
            a.out, dict(name="h200-torch-one-expert", provenance=prov, records=records, variants=variants)
        )

    dtype = torch.bfloat16
    for name, (H, inter, k, E) in MODELS.items():
        for n in tokens_per_rank[:2] if a.dry_run else tokens_per_rank:
            if time.time() - t0 > a.budget_s:
                break
            rows = n * k  # tokens x top-k over E experts, one per rank: n x k rows on the mean rank
            foot = 3 * H * inter + rows * (H + 2 * inter) * 2
            n_inst = 1 if a.dry_run else moe_timing.n_instances(foot)
            row = dict(model=name, tokens_per_rank=n, rows=rows)
            try:
                row.update(_time_row(H, inter, k, E, n, rows, device, dtype, n_inst, a.dry_run, not a.skip_grouped))
                if not a.dry_run:
                    rec = dict(op="moe", dtype="fp8", tokens=n * E, hidden=H, inter=inter, topk=k, experts=E, ep=E)
                    records.append(dict(rec, ms=row["lean_ms"]))
            except Exception as e:  # one failed row count must not lose the others
                row["skipped"] = f"{type(e).__name__}: {str(e)[:160]}"
            variants.append(row)
            write()
            print(json.dumps(row), flush=True)
    write()
    print(f"{len(records)} records, {len(variants)} rows in {time.time() - t0:.0f} s -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
