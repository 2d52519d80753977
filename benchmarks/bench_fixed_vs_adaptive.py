"""Fixed-length DSpark (K = 1, 3, 5, 7) vs adaptive DSpark vs no speculation, across load, per profile.

The target behaviour (DSpark paper, Sec. 5.4; vLLM adaptive verification): each fixed K is best
only near the load it suits (a long K at low load, a short one at high load), while adaptive
verification stays at or above every fixed K from concurrency 1 to 256 per GPU, and its verify
budget per request falls as load grows.

Concurrency is per GPU (``--per-node``: per node): a node of G GPUs in C users per GPU runs C x G users (with data-parallel
attention each GPU is an engine replica; with TP attention a replica spans several GPUs).

Usage: python benchmarks/bench_fixed_vs_adaptive.py --profile NAME [--concurrency 1,4,16,64,128,256,384]
       [--requests-per-user 6] [--trace default] [--jobs N] [--markdown]
       [--max-num-batched-tokens N] [--disaggregated] [--policy vllm|sglang|paper-production] [--seed S]
"""

from __future__ import annotations

import argparse
import time

FIXED_K = (1, 3, 5, 7)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", required=True)
    ap.add_argument(
        "--concurrency",
        default="1,4,16,64,128,256,384",
        help="users per GPU (or per node with --per-node); the DSpark paper's loads reach a few hundred per GPU",
    )
    ap.add_argument(
        "--per-node",
        action="store_true",
        help="concurrency counts users per node (the seeds' axis for a TP8 replica) instead of per GPU",
    )
    ap.add_argument("--requests-per-user", type=int, default=6)
    ap.add_argument("--min-requests", type=int, default=160)
    ap.add_argument("--trace", default="default")
    ap.add_argument("--acceptance", default=None, help="acceptance preset for DSpark (default: the method's)")
    ap.add_argument("--k", type=int, default=7, help="adaptive DSpark's block size")
    ap.add_argument(
        "--policy",
        default="vllm",
        help="adaptive DSpark's verify-budget policy (vllm: the budget from the previous step's confidences; "
        "sglang: the same E/C rule on the current ones; paper-production: two steps old)",
    )
    ap.add_argument("--seed", type=int, default=0, help="simulation seed (the same seed for every method: paired)")
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help="the engine's token budget per step (default: vLLM's, 8192)",
    )
    ap.add_argument(
        "--disaggregated",
        action="store_true",
        help="decode instances of a prefill/decode-disaggregated deployment (prompts' KV arrives computed)",
    )
    a = ap.parse_args()
    from dsim.cost import load_profile
    from dsim.scenario import build_workload
    from dsim.sim import SpecConfig
    from dsim.study.sweep import sweep

    prof = load_profile(a.profile)
    per_gpu = [int(x) for x in a.concurrency.split(",")]
    node_c = per_gpu if a.per_node else [c * a.gpus_per_node for c in per_gpu]
    specs = {"none": SpecConfig("none", acceptance=a.acceptance)}
    for k in FIXED_K:
        specs[f"K={k}"] = SpecConfig("dspark", k=k, adaptive=False, acceptance=a.acceptance)
    specs["adaptive"] = SpecConfig("dspark", k=a.k, adaptive=True, policy=a.policy, acceptance=a.acceptance)
    from dsim.engine.config import EngineConfig

    eng = {}
    if a.max_num_batched_tokens:
        eng["max_num_batched_tokens"] = a.max_num_batched_tokens
    if a.disaggregated:
        eng["kv_role"] = "kv_consumer"
    base = build_workload(a.trace)
    t0 = time.perf_counter()
    df = sweep(
        base,
        prof,
        specs,
        node_c,
        requests_per_user=a.requests_per_user,
        min_requests=a.min_requests,
        gpus_per_node=a.gpus_per_node,
        jobs=a.jobs,
        seed=a.seed,
        engine=EngineConfig(**eng) if eng else None,
    )
    wall = time.perf_counter() - t0
    tab = df.pivot(index="concurrency", columns="method", values="output_tok_s_per_gpu")
    user = df.pivot(index="concurrency", columns="method", values="output_tok_s_per_user")
    ver = df.pivot(index="concurrency", columns="method", values="verify_tokens_per_request")
    cols = list(specs)
    print(f"profile: {prof.label}")
    print(
        f"workload: {base.source}; {a.requests_per_user} requests per user (min {a.min_requests}); "
        f"adaptive policy {a.policy}; seed {a.seed}" + (f"; engine {eng}" if eng else "")
    )
    sep = " | " if a.markdown else " "
    head = (
        ["C/node" if a.per_node else "C/GPU"]
        + [f"{c} tok/s/GPU" for c in cols]
        + ["best fixed", "adaptive / best fixed", "adaptive verify/req", "adaptive tok/s/user"]
    )
    if a.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
    else:
        print(sep.join(f"{h:>14}" for h in head))
    ok = True
    for c, cn in zip(per_gpu, node_c):
        row = tab.loc[cn]
        fixed = {f"K={k}": row[f"K={k}"] for k in FIXED_K}
        best = max(fixed, key=fixed.get)
        r = row["adaptive"] / fixed[best]
        ok &= r >= 0.98
        vals = (
            [str(c)]
            + [f"{row[m]:.0f}" for m in cols]
            + [best, f"{r:.3f}", f"{ver.loc[cn, 'adaptive']:.2f}", f"{user.loc[cn, 'adaptive']:.1f}"]
        )
        if a.markdown:
            print("| " + " | ".join(vals) + " |")
        else:
            print(sep.join(f"{v:>14}" for v in vals))
    v = [ver.loc[cn, "adaptive"] for cn in node_c]
    print(
        f"adaptive at or above every fixed K (within 2%) at every load: {'yes' if ok else 'NO'}; "
        f"verify budget per request {v[0]:.2f} -> {v[-1]:.2f} ({'falls' if v[-1] < v[0] else 'does NOT fall'}); "
        f"wall {wall:.0f} s"
    )


if __name__ == "__main__":
    main()
