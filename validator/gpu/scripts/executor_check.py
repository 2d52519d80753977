"""The executor's weight: kernels per layer and step times of the eager dense path against the
torch.compile'd one (validator.gpu.model.compile_dense) and the compiled one with the one-call
varlen attention (StepMeta impl='varlen') and with the packed one (impl='packed',
validator.gpu.packed_attention), same model, same steps, one process.

    python3 validator/gpu/scripts/executor_check.py --model profiles/models/llama-3.1-8b.json \
        --out $OUT/executor-llama-3.1-8b.json [--dry-run]

Steps: one request with an n-token verify window at context 1 (the dense part alone, attention
over a single key) and the profile sweep's table step of the same n (1K-median contexts), for n in
SIZES, and a busy step (64 verify requests plus whole prompts, 1024 tokens), each captured as a CUDA
graph (Timer). Writes one JSON record per (variant, step).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

SIZES = (1, 8, 64, 256, 512)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)

    from validator.gpu import model as M
    from validator.gpu import plan as P
    from validator.gpu.profile_files import write_text_atomic

    device, dtype = M.executor_device(a.dry_run)
    cfg = json.loads(Path(a.model).read_text())
    if a.dry_run:
        cfg = {**cfg, **P.DRY_CFG}
    dims = P.model_dims(cfg)
    model = M.Model(cfg, device, dtype, pool_gib=2.0 if not a.dry_run else 0.02)
    caps = P.vllm_capture_sizes(P.CAPTURE_LIMIT)
    sizes = SIZES if not a.dry_run else (1, 8)
    table = {s.n: s for s in P.sweep_plan(caps, kv_budget_tokens=int(model.pool_tokens * 0.9)) if s.tag == "table"}
    steps = []
    for n in sizes:
        steps.append(("ctx1", P.uniform_step(1, n, 1)))
        if n in table and not a.dry_run:
            steps.append(("table", table[n]))
    timer = M.Timer(device, a.reps)
    rows = []
    if not a.dry_run:  # a busy step: 64 verify requests and whole prompts (the one-call path's case)
        steps.append(("mixed", P.dspark_mixed_step(1024, 64, 64)))
    for variant in ("eager", "compiled", "varlen", "packed"):
        t0 = time.time()
        if variant == "compiled":
            M.compile_dense(model)
        impl = variant if variant in ("varlen", "packed") else "split"
        for kind, shape in steps:
            m = M.StepMeta(shape, P.padded_tokens(shape.n, caps), dims, device, impl=impl)
            ms, reps = timer(functools.partial(model.forward, m), graph=device.type == "cuda")
            kpl = M.kernels_per_layer(model, m) if device.type == "cuda" else None
            rows.append(
                dict(
                    variant=variant,
                    step=kind,
                    n=shape.n,
                    R=shape.requests,
                    kv=shape.kv,
                    ms=ms,
                    reps=[round(r, 4) for r in reps],
                    kernels_per_layer=kpl,
                )
            )
            print(f"  {variant:8s} {kind:5s} n={shape.n:4d}: {ms:8.3f} ms, kernels/layer {kpl}", flush=True)
            write_text_atomic(a.out, json.dumps(dict(model=a.model, layers=dims["layers"], rows=rows), indent=1))
        print(f"{variant} in {time.time() - t0:.1f}s", flush=True)


if __name__ == "__main__":
    main()
