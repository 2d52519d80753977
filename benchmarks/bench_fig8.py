"""Check against the DSpark paper's Fig. 8 (DeepSeek-V4, MTP-1 vs DSpark, closed loop, one node).

Runs the closed-loop sweep with dsim's defaults (MTP-1 with the deepseek-v4 preset's 85-90%
second-token acceptance; DSpark adaptive with the deepseek-v4 preset, K = 5 as the paper's
DSpark-5; the preset's equal class mix; default profile and trace) and prints, per concurrency, DSpark / MTP-1 output throughput per GPU and the verify tokens
per request per step, next to the paper's figures.

Usage: python benchmarks/bench_fig8.py [--concurrency 1,2,...] [--requests-per-user 8] [--jobs N]
       [--out DIR (writes sweep.csv and the figures)]
"""
from __future__ import annotations

import argparse
import time

# DSpark paper Fig. 8 (DeepSeek-V4-Flash), read off the figure (approximate).
PAPER_RATIO = {32: 1.6, 128: 1.3, 200: 1.2}
PAPER_VERIFY = "DSpark about 5 at low load falling to about 3.5 near 200; MTP-1 2"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--concurrency", default="1,2,4,8,16,32,64,128,200,256")
    ap.add_argument("--requests-per-user", type=int, default=8)
    ap.add_argument("--min-requests", type=int, default=200)
    ap.add_argument("--trace", default="default")
    ap.add_argument("--k", type=int, default=5, help="DSpark block size (the paper's Fig. 8 runs DSpark-5)")
    ap.add_argument("--mix", default="math=0.34,code=0.33,chat=0.33",
                    help="class mix (the deepseek-v4 preset is anchored on an equal mix)")
    ap.add_argument("--profile", default=None)
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    from dsim.scenario import build_workload, method_spec
    from dsim.cost import load_profile
    from dsim.sweep import sweep, write_sweep
    conc = [int(x) for x in a.concurrency.split(",")]
    from dsim.sim import SpecConfig
    specs = {"mtp": method_spec("mtp"), "dspark": SpecConfig("dspark", k=a.k, adaptive=True)}
    prof = load_profile(a.profile)
    base = build_workload(a.trace, mix=a.mix)
    t = time.perf_counter()
    df = sweep(base, prof, specs, conc, requests_per_user=a.requests_per_user, min_requests=a.min_requests,
               jobs=a.jobs)
    dt = time.perf_counter() - t
    if a.out:
        write_sweep(df, a.out)
    m = df[df.method == "mtp"].set_index("concurrency")
    d = df[df.method == "dspark"].set_index("concurrency")
    print(f"profile: {prof.label}")
    print(f"workload: {base.source}")
    print(f"{'C':>5} {'MTP-1 tok/s/GPU':>16} {'DSpark tok/s/GPU':>17} {'ratio':>7} {'paper':>6} "
          f"{'DSpark verify':>14} {'MTP verify':>11} {'DSpark accept':>14}")
    ratios = {}
    for c in conc:
        r = d.loc[c, "output_tok_s_per_gpu"] / m.loc[c, "output_tok_s_per_gpu"]
        ratios[c] = r
        paper = f"{PAPER_RATIO[c]:.1f}x" if c in PAPER_RATIO else ""
        print(f"{c:>5} {m.loc[c, 'output_tok_s_per_gpu']:>16.1f} {d.loc[c, 'output_tok_s_per_gpu']:>17.1f} "
              f"{r:>6.2f}x {paper:>6} {d.loc[c, 'verify_tokens_per_request']:>14.2f} "
              f"{m.loc[c, 'verify_tokens_per_request']:>11.2f} {d.loc[c, 'acceptance_length']:>14.2f}")
    print(f"paper verify budget: {PAPER_VERIFY}")
    above = all(r > 1 for r in ratios.values())
    hi = [c for c in conc if c >= 32]
    shrinking = all(ratios[x] >= ratios[y] - 0.02 for x, y in zip(hi, hi[1:]))
    vd = [d.loc[c, "verify_tokens_per_request"] for c in conc]
    print(f"shape: ratio > 1 everywhere: {above}; ratio non-increasing from C=32: {shrinking}; "
          f"DSpark verify/request first {vd[0]:.2f} -> last {vd[-1]:.2f} (paper ~5 -> ~3.5)")
    print(f"sweep took {dt:.1f} s")


if __name__ == "__main__":
    main()
