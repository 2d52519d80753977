"""One layer's attention alone, the executor's paths (StepMeta impl 'split', 'varlen', 'packed'),
against what vLLM 0.24's FlashAttention-3 kernels take for the same shapes on the same GPU
(AIConfigurator's silicon tables, generation_attention / context_attention, read with --compare;
--system h100_sxm for an H100).

    python3 validator/gpu/scripts/attention_check.py --model profiles/models/llama-3.1-8b.json \
        --out $OUT/attention-llama-3.1-8b.json [--dry-run]          # on the GPU
    python3 validator/gpu/scripts/attention_check.py --compare FILE   # CPU: joins AIC's rows

Shapes: decode steps of R requests with one new token each over a uniform context c (R in
DECODE_R, c + 1 in DECODE_KV: points of AIC's grid, no interpolation), and one prefill chunk of
q tokens at context 0 (PREFILL_Q). Each is captured as a CUDA graph of one attention call (the
layer's new K/V written first, as in the step); kernels per call counted with torch.profiler.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

DECODE_R = (1, 8, 32, 128, 256)
VERIFY = ((32, 4, 4096), (64, 8, 2048), (256, 4, 1024), (256, 8, 1024))  # (requests, window, keys) of verify steps
DECODE_KV = (1024, 4096, 16384)  # keys per request (AIC's step + 1)
PREFILL_Q = (512, 2048, 8192)


def measure(a: argparse.Namespace) -> None:
    import torch

    from validator.gpu import model as M
    from validator.gpu import plan as P
    from validator.gpu.profile_files import write_text_atomic

    device, dtype = M.executor_device(a.dry_run)
    cfg = json.loads(Path(a.model).read_text())
    if a.dry_run:
        cfg = {**cfg, **P.DRY_CFG}
    dims = P.model_dims(cfg)
    H, kv, d = dims["heads"], dims["kv_heads"], dims["head_dim"]
    shapes = [("decode", P.uniform_step(R, 1, c - 1)) for R in DECODE_R for c in DECODE_KV]
    shapes += [("verify", P.uniform_step(R, s, c - s)) for R, s, c in VERIFY]
    shapes += [("prefill", P.StepShape((q,), (0,))) for q in PREFILL_Q]
    if a.dry_run:
        shapes = [("decode", P.uniform_step(4, 1, 63)), ("prefill", P.StepShape((40,), (0,)))]
    timer = M.Timer(device, a.reps)
    rows = []
    for kind, shape in shapes:
        varlen: tuple | None = None
        for impl in M.ATTENTION_IMPLS:
            m = M.StepMeta(shape, shape.n, dims, device, impl=impl)
            diff = None
            if impl == "packed" and varlen is not None:  # the same regions: the same inputs
                mv, pk, pv, x = varlen
                pk.index_copy_(0, m.slot, x[:, H : H + kv])
                pv.index_copy_(0, m.slot, x[:, H + kv :])
                want, got = M.attention(x, (pk, pv), mv).float(), M.attention(x, (pk, pv), m).float()
                diff = float((got - want).abs().max() / want.abs().max().clamp_min(1e-6))
            else:
                pk = torch.randn(m.region_tokens, kv, d, device=device, dtype=dtype)
                pv = torch.randn(m.region_tokens, kv, d, device=device, dtype=dtype)
                x = torch.randn(m.n_pad, H + 2 * kv, d, device=device, dtype=dtype) * d**-0.5
            if impl == "varlen":
                varlen = (m, pk, pv, x)

            def step(m=m, pk=pk, pv=pv, x=x):
                pk.index_copy_(0, m.slot, x[:, H : H + kv])
                pv.index_copy_(0, m.slot, x[:, H + kv :])
                return M.attention(x, (pk, pv), m)

            ms, reps = timer(functools.partial(step), graph=device.type == "cuda")
            kernels = None
            if device.type == "cuda":
                from torch.profiler import ProfilerActivity, profile

                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    step()
                    torch.cuda.synchronize()
                kernels = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
            rows.append(
                dict(
                    kind=kind,
                    impl=impl,
                    R=shape.requests,
                    q=max(shape.q),
                    keys=max(c + s for s, c in zip(shape.q, shape.ctx)),
                    ms=round(ms, 5),
                    reps=[round(r, 5) for r in reps],
                    kernels=kernels,
                    rel_diff_vs_varlen=diff,
                )
            )
            print(json.dumps(rows[-1]), flush=True)
            write_text_atomic(
                a.out, json.dumps(dict(model=a.model, heads=H, kv_heads=kv, head_dim=d, rows=rows), indent=1)
            )
        del pk, pv, x
        varlen = None


def compare(path: str, system: str = "h200_sxm") -> None:
    """AIC's vLLM 0.24 FA3 rows (bf16 KV, no window) of ``system`` for each measured shape: exact grid
    points."""
    import pandas as pd

    from dsim.profiling.aic_source import aic_root

    rec = json.loads(Path(path).read_text())
    base = aic_root() / "systems" / "data" / system / "attention" / "vllm" / "0.24.0"
    gen = pd.read_parquet(base / "generation_attention_perf.parquet")
    ctx = pd.read_parquet(base / "context_attention_perf.parquet")
    sel = dict(
        num_heads=rec["heads"],
        num_key_value_heads=rec["kv_heads"],
        head_dim=rec["head_dim"],
        kernel_source="vllm_flash_attn_fa3",
        kv_cache_dtype="bfloat16",
        window_size=0,
    )
    out = []
    for r in rec["rows"]:
        if r["impl"] != "split":
            continue
        v = {
            x["impl"]: x
            for x in rec["rows"]
            if (x["kind"], x["R"], x["q"], x["keys"]) == (r["kind"], r["R"], r["q"], r["keys"])
        }
        aic = None  # (AIC's generation rows are one-token queries: none for verify windows)
        if r["kind"] != "verify":
            q = gen if r["kind"] == "decode" else ctx
            for k, val in sel.items():
                q = q[q[k] == val]
            if r["kind"] == "decode":
                q = q[(q.batch_size == r["R"]) & (q.step == r["keys"] - 1)]
            else:
                q = q[(q.batch_size == 1) & (q.isl == r["q"]) & (q.step == 0)]
            aic = float(q.latency.median()) if len(q) else None
        row = dict(
            kind=r["kind"],
            R=r["R"],
            q=r["q"],
            keys=r["keys"],
            split_ms=v["split"]["ms"],
            varlen_ms=v.get("varlen", {}).get("ms"),
            packed_ms=v.get("packed", {}).get("ms"),
            aic_fa3_ms=aic,
            split_kernels=v["split"]["kernels"],
            varlen_kernels=v.get("varlen", {}).get("kernels"),
            packed_kernels=v.get("packed", {}).get("kernels"),
        )
        out.append(row)
        print(json.dumps(row))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(ROOT / "profiles" / "models" / "llama-3.1-8b.json"))
    ap.add_argument("--out", default="")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--compare", default="", help="a measured FILE: print AIC's rows beside it (CPU)")
    ap.add_argument("--system", default="h200_sxm", help="--compare: AIC's system (h100_sxm, h200_sxm, ...)")
    a = ap.parse_args(argv)
    if a.compare:
        compare(a.compare, a.system)
    else:
        measure(a)


if __name__ == "__main__":
    main()
