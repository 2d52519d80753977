"""The DSpark paper's cost shape: a shipped wide-EP profile mapped onto the paper's MTP-1 line, then
the Sec. 5.4 comparison (benchmarks/bench_paper.py) on it.

Why: the paper does not name its hardware or layout, so dsim's absolute step costs and the paper's
differ (docs/paper-reproduction.md, "Where the step goes"). Mapping a shipped profile linearly onto
the paper's own MTP-1 line takes that question away: MTP-1 is then the fitted line, and everything
DSpark does on the derived profile (its throughput, its verify budget, its gains at the SLAs) is a
prediction from DSpark's own inputs (acceptance, drafter, head, budget rule).

The map (two parameters, F and b)::

    forward'(n) = F + b (forward(n) - forward(1))

and every other cost term of the profile (the per-request attention table and its share of the
forward table, the KV slope, the prefill terms, the drafter tables) times b. So a step that costs
T on the base profile costs F + b (T - forward(1)) on the derived one: F is the one-token step, b
the slope of everything beyond it.

The fit uses only MTP-1's Fig. 8 line (the paper's fitted solid line, read at C = 10, 20, 50, 100,
150, 200 requests per GPU; bench_paper.PAPER[...]["fig8_mtp"]). MTP-1's schedule does not depend
on step costs (no budget), and on decode instances with overlapped scheduling a closed loop runs
the same steps whatever they cost, so its mean step at the paper's load C on the derived profile is
F + b (T(C) - forward(1)), T(C) the base profile's mean step there (1000 x acceptance length /
per-user speed), and the paper's line needs T_need(C) = 1000 C tau(C) / throughput_paper(C).
F and b minimise sum_C ((F + b (T(C) - forward(1))) / T_need(C) - 1)^2 (linear least squares);
the derived profile is then simulated and the fit corrected by each point's measured departure
from the prediction (the closed loop's ramp and drain), until MTP-1 is within --tolerance of the
paper's line at every point, or --iterations run out.

Usage:
  python benchmarks/paper_shape.py                       # both paper profiles: fit, then Sec. 5.4
  python benchmarks/paper_shape.py --profile deepseek-v4-flash-h200-dp256-ep256-dbo --fit-only
  python benchmarks/paper_shape.py --profile-dir out/paper-shape --acceptance-dspark PRESET --policy paper
Derived profiles are written to --profile-dir as NAME-paper-shape.yaml (provenance kind "derived":
the base profile, the map, F, b, the points fitted and the residuals) and reused on the next run
unless --refit. Every bench_paper option not named here passes through (--per-gpu, --trace, ...).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_paper as B  # noqa: E402

FIT_PER_GPU = (5, 10, 20, 50, 100, 150, 200, 300)  # nominal closed-loop loads spanning the paper's C


def derive_profile(base, F: float, b: float, name: str | None = None, fit: dict | None = None):
    """The base Profile mapped onto F + b (cost - forward(1)) (module doc). F > 0, b > 0.
    Postcondition: every step priced by the derived profile costs F + b (T - forward(1)), T its
    cost on the base, for the forward, attention, KV, prefill and drafter terms alike."""
    from dsim.cost import Table

    if not (F > 0 and b > 0):
        raise ValueError(f"derive_profile: F and b must be > 0, got F={F}, b={b}")
    if base.attention is not None:
        raise ValueError(f"{base.name}: format-2 attention terms are not mapped (a format-3 profile is)")
    ra = base.request_attention
    if ra is not None and (ra.step_keys is not None or ra.block_pool is not None or ra.indexer_ms_per_mcell):
        raise ValueError(f"{base.name}: step_keys / block_pool / step_indexer terms are not mapped")
    f1 = float(base.forward.ms[0])
    fwd = Table(base.forward.x.copy(), F + b * (base.forward.ms - f1))
    draft = {k: Table(t.x.copy(), b * t.ms) for k, t in base.draft.items()}
    if ra is not None:
        ra = dataclasses.replace(ra, step_ms=b * ra.step_ms, forward_share_ms=b * ra.forward_share_ms)
    pv2 = base.prefill_v2
    if pv2 is not None:
        pv2 = dataclasses.replace(
            pv2,
            cached_ms_per_mpair=b * pv2.cached_ms_per_mpair,
            within_ms_per_mpair=b * pv2.within_ms_per_mpair,
            token_ms_per_ktok=b * pv2.token_ms_per_ktok,
            ms_per_chunk=b * pv2.ms_per_chunk,
            ms_per_step=b * pv2.ms_per_step,
        )
    bp = base.provenance
    method = (
        f"derived from profile {base.name} ([{bp.get('kind')}] {bp.get('method')}) by the linear map "
        f"forward'(n) = F + b (forward(n) - forward(1)) with F = {F:.3f} ms, b = {b:.4f}, forward(1) = {f1:.3f} ms; "
        "per-request attention, its forward share, the KV slope, prefill terms and drafter tables times b; "
        "F and b fitted to the DSpark paper's Fig. 8 MTP-1 line only (benchmarks/paper_shape.py)"
    )
    prov = dict(
        bp,
        kind="derived",
        method=method,
        date=time.strftime("%Y-%m-%d"),
        command="python3 benchmarks/paper_shape.py --profile " + base.name,
        derived_from=base.name,
        paper_shape={"F_ms": round(F, 4), "b": round(b, 5), "forward1_ms": round(f1, 4), **(fit or {})},
    )
    return dataclasses.replace(
        base,
        name=name or f"{base.name}-paper-shape",
        provenance=prov,
        forward=fwd,
        draft=draft,
        kv_ms_per_ktok=b * base.kv_ms_per_ktok,
        prefill_discount_ms_per_ktok=b * base.prefill_discount_ms_per_ktok,
        prefill_attn_ms_per_mpair=b * base.prefill_attn_ms_per_mpair,
        prefill_ms_per_chunk=b * base.prefill_ms_per_chunk,
        prefill_v2=pv2,
        request_attention=ra,
        source_path="",
    )


def mtp_sweep(profile, args, per_gpu):
    """MTP-1's closed loop on `profile` at `per_gpu` loads, on the engine bench_paper runs
    (args.variant), as bench_paper's DataFrame."""
    from dsim.frontier import concurrency_from_per_gpu
    from dsim.scenario import build_workload
    from dsim.sim import SpecConfig
    from dsim.sweep import sweep

    conc = concurrency_from_per_gpu(per_gpu, profile, 1, args.gpus_per_node)
    acc = args.acceptance_mtp or args.acceptance
    return sweep(
        build_workload(args.trace_one, mix=args.mix),
        profile,
        {"mtp": SpecConfig("mtp", k=1, acceptance=acc)},
        conc,
        requests_per_user=args.requests_per_user,
        min_requests=args.min_requests,
        gpus_per_node=args.gpus_per_node,
        jobs=args.jobs,
        engine=B.engine_for(args.variant, args),
        seed=args.seed,
    )


def at_paper_loads(df, cs):
    """(mean step ms, acceptance length, throughput per GPU) of df's MTP-1 read at the paper's loads
    cs (requests in decode per GPU, C = throughput / per-user speed; log-log interpolation, as
    bench_paper reads its curves). None where the sweep does not span a load."""
    g = df[df.method == "mtp"].copy()
    g["c_decode"] = g["output_tok_s_per_gpu"] / g["output_tok_s_per_user"]
    g["step_ms"] = 1000.0 * g["acceptance_length"] / g["output_tok_s_per_user"]
    g = g.sort_values("c_decode")
    xs = list(g["c_decode"])
    out = []
    for c in cs:
        vals = [B._interp_loglog(c, xs, list(g[col])) for col in ("step_ms", "acceptance_length", "output_tok_s_per_gpu")]
        out.append(None if None in vals else tuple(vals))
    return out


def solve_fb(g, need, extra=None):
    """F, b minimising sum ((F + b g + extra) / need - 1)^2 (relative error at each point)."""
    g, need = np.asarray(g, float), np.asarray(need, float)
    e = np.zeros_like(g) if extra is None else np.asarray(extra, float)
    A = np.stack([1.0 / need, g / need], axis=1)
    y = 1.0 - e / need
    (F, b), *_ = np.linalg.lstsq(A, y, rcond=None)
    return float(F), float(b)


def fit_paper_shape(base, args, log=print):
    """(derived profile, fit record): F and b fitted to the paper's MTP-1 line (module doc)."""
    P = B.PAPER[B.paper_for(base.provenance.get("model"))]
    cs, thr_paper = list(P["fig8_c"]), list(P["fig8_mtp"])
    f1 = float(base.forward.ms[0])
    t0 = time.perf_counter()
    pts = at_paper_loads(mtp_sweep(base, args, FIT_PER_GPU), cs)
    if any(p is None for p in pts):
        raise SystemExit(f"{base.name}: the MTP-1 sweep at {FIT_PER_GPU} per GPU does not span the paper's loads {cs}")
    g = np.array([p[0] - f1 for p in pts])  # the base's mean step beyond the one-token forward
    need = np.array([1000.0 * c * p[1] / t for c, p, t in zip(cs, pts, thr_paper)])
    extra = np.zeros_like(g)
    history = []
    derived = None
    F = b = float("nan")
    for it in range(args.iterations):
        F, b = solve_fb(g, need, extra)
        derived = derive_profile(base, F, b)
        got = at_paper_loads(mtp_sweep(derived, args, FIT_PER_GPU), cs)
        if any(p is None for p in got):
            raise SystemExit(f"{derived.name}: the MTP-1 sweep does not span the paper's loads {cs}")
        resid = [p[2] / t - 1.0 for p, t in zip(got, thr_paper)]
        history.append({"F_ms": round(F, 4), "b": round(b, 5), "residuals": [round(r, 4) for r in resid]})
        log(f"  fit {it + 1}: F = {F:.3f} ms, b = {b:.4f}; MTP-1 vs the paper's line at C/GPU {cs}: "
            + " ".join(f"{100 * r:+.1f}%" for r in resid))
        if max(abs(r) for r in resid) <= args.tolerance:
            break
        # the closed loop's departure from the invariant-step prediction, kept for the next solve
        extra = np.array([p[0] - (F + b * gi) for p, gi in zip(got, g)])
    fit = {
        "fitted_on": f"DSpark paper Fig. 8 MTP-1 fitted line ({P['model']}): C/GPU {cs} -> {thr_paper} tok/s/GPU",
        "engine": f"{args.variant}, overlapped scheduling, trace {args.trace_one}, seed {args.seed}",
        "iterations": history,
        "max_abs_residual": round(max(abs(r) for r in history[-1]["residuals"]), 4),
        "fit_wall_s": round(time.perf_counter() - t0, 1),
    }
    derived = derive_profile(base, F, b, fit=fit)
    return derived, fit


def write_profile(profile, path: Path) -> None:
    import yaml

    from dsim.cost import profile_to_dict

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(yaml.safe_dump(profile_to_dict(profile), sort_keys=False, width=120))
    tmp.replace(path)


def derived_for(name: str, args, log=print):
    """The derived profile for base profile `name`: read from --profile-dir, or fitted and written."""
    from dsim.cost import load_profile

    base = load_profile(name)
    path = Path(args.profile_dir) / f"{base.name}-paper-shape.yaml"
    if path.exists() and not args.refit:
        prof = load_profile(str(path))
        log(f"{base.name}: derived profile read from {path} (F = {prof.provenance['paper_shape']['F_ms']} ms, "
            f"b = {prof.provenance['paper_shape']['b']}; --refit fits again)")
        return prof
    log(f"{base.name}: fitting F and b to the paper's MTP-1 line")
    prof, _ = fit_paper_shape(base, args, log)
    write_profile(prof, path)
    log(f"{base.name}: wrote {path}")
    return load_profile(str(path))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], add_help=True)
    ap.add_argument("--profile-dir", default="out/paper-shape", help="where derived profiles are written and read")
    ap.add_argument("--refit", action="store_true", help="fit again even where a derived profile exists")
    ap.add_argument("--fit-only", action="store_true", help="fit and write the derived profiles, no comparison")
    ap.add_argument("--iterations", type=int, default=3, help="fit corrections at most (each one MTP-1 sweep)")
    ap.add_argument("--tolerance", type=float, default=0.02, help="MTP-1's largest relative miss that ends the fit")
    ap.add_argument("--fit-trace", default="default", help="the trace the fit's MTP-1 runs on")
    ap.add_argument("--fit-variant", default="disaggregated", choices=B.VARIANTS)
    a, rest = ap.parse_known_args(argv)
    # bench_paper's own options, with this harness's defaults: decode instances, no static sweep
    bp_args = ["--variants", "disaggregated", "--trace", "default", "--no-static"]
    bp = B.build_parser().parse_args(bp_args + rest)
    bp.trace_one, bp.variant = a.fit_trace, a.fit_variant
    a.__dict__.update({k: v for k, v in vars(bp).items() if k not in a.__dict__})
    names = [p.strip() for p in bp.profile.split(",") if p.strip()]
    derived = [derived_for(n, a, log=lambda s: print(s, file=sys.stderr)) for n in names]
    if a.fit_only:
        return
    cmd = "python benchmarks/paper_shape.py " + " ".join(argv if argv is not None else sys.argv[1:])
    B.run_all(derived, bp, cmd.strip())


if __name__ == "__main__":
    main()
