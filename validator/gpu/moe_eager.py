"""What a step costs without a CUDA graph: the layer-shard executor's step launched op by op beside the same
step replayed as one CUDA graph, on one GPU (communication excluded, as in moe_shard).

    python3 -m validator.gpu.moe_eager --out eager.json [--model deepseek-v4-flash --topology dp8-ep8]
        [--shapes 64x8,128x8,256x8 --ctx 2048 --reps 5]

Above its capture limit vLLM runs a step without any CUDA graph (its CUDA-graph dispatcher returns the NONE
mode for a batch larger than the largest capture size; vLLM docs, design/cuda_graphs.md), so every kernel
is launched from the host. Per shape (requests x query tokens at one context) this records:
- graph_ms: the step replayed as one CUDA graph (moe_shard.time_step), the price the kernel tables hold;
- eager_ms: the same step launched op by op, timed on the GPU from before the first launch to after the
  last kernel (what the step takes when the host launches it), median of reps after warm-up;
- host_ms: the host's time to issue the step's launches (no synchronisation inside);
- overhead_ms = eager_ms - graph_ms, and per layer.
Our executor launches torch eager ops and Triton kernels one by one; vLLM's eager path runs its
torch.compile (Inductor) code with fused elementwise kernels, so it issues fewer launches: our host time is
an upper bound on the launch work, and the overhead a bound on what the missing graph adds where the GPU
work of a launch is shorter than its host time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from validator.gpu import moe_shard as S
from validator.gpu import moe_timing


def parse_shapes(s: str) -> list[tuple[int, int]]:
    out = []
    for part in s.split(","):
        r, q = part.lower().split("x")
        out.append((int(r), int(q)))
    return out


def time_eager(fn, device, reps: int, warm: int = 2) -> tuple[float, float, list[float]]:
    """(median GPU-timeline ms, median host issue ms, GPU samples) of fn launched op by op."""
    import torch

    if device.type != "cuda":
        t0 = time.perf_counter()
        fn()
        dt = (time.perf_counter() - t0) * 1e3
        return dt, dt, []
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    gpu, host = [], []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        a.record()
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e3)
        b.record()
        b.synchronize()
        gpu.append(a.elapsed_time(b))
    return float(np.median(gpu)), float(np.median(host)), gpu


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="deepseek-v4-flash")
    ap.add_argument("--topology", default="dp8-ep8")
    ap.add_argument("--shapes", default="8x8,32x8,64x8,128x8,256x8,128x4,256x4,512x4")
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tune", default="")
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    try:
        shapes = parse_shapes(a.shapes)
    except ValueError:
        print(f"error: --shapes {a.shapes!r}: expected RxQ[,RxQ...]", file=sys.stderr)
        return 2
    device, shard = S._setup(a)
    info = S.run_info(device, shard, a)
    info.update(ctx=a.ctx, reps=a.reps)
    print(json.dumps(info), flush=True)
    rows: list[dict] = []
    out = dict(info=info, rows=rows)
    for i, (r, q) in enumerate(shapes):
        if a.dry_run:
            r, q = min(r, 4), min(q, 8)
        ql, cl = [q] * r, [min(a.ctx, 300) if a.dry_run else a.ctx] * r
        total = sum(ql) * (shard.topo.gpus if shard.topo.attn == "dp" else 1)
        t0 = time.time()
        fn = shard.step(ql, cl, total, seed=i)
        eager, host, ts = time_eager(fn, device, a.reps)
        graph, gs = S.time_step(fn, device, a.reps)
        scale = shard.depth_scale
        row = dict(
            requests=r,
            query=q,
            tokens=r * q,
            ctx=cl[0],
            moe_tokens=total,
            graph_ms=round(graph * scale, 4),
            eager_ms=round(eager * scale, 4),
            host_ms=round(host * scale, 4),
            overhead_ms=round((eager - graph) * scale, 4),
            overhead_us_per_layer=round((eager - graph) * scale / shard.full_layers * 1e3, 2),
            eager_spread=round((max(ts) - min(ts)) / max(eager, 1e-9), 4) if ts else None,
            graph_spread=round((max(gs) - min(gs)) / max(graph, 1e-9), 4) if gs else None,
        )
        rows.append(row)
        moe_timing.write_json_atomic(a.out, out)
        print(
            f"EAGER {a.model} {a.topology} {r}x{q} tok={r * q} graph={row['graph_ms']:.3f} eager={row['eager_ms']:.3f} "
            f"host={row['host_ms']:.3f} over={row['overhead_ms']:+.3f}ms ({row['overhead_us_per_layer']:+.1f}us/layer) "
            f"({time.time() - t0:.1f}s)",
            flush=True,
        )
        del fn
        if device.type == "cuda":
            import torch

            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
