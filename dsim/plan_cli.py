"""`dsim plan`, `dsim sweep`, `dsim ab`: registered on dsim.cli's typer app (dsim.entry imports this
module; dsim.cli does not)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from dsim.cli import (
    DisaggregatedOpt,
    FormatOpt,
    GpusPerNodeOpt,
    MixOpt,
    ProfileOpt,
    RateOpt,
    RateScaleOpt,
    RemotePrefillMsOpt,
    RemotePrefillPerKtokOpt,
    RequestsOpt,
    TraceOpt,
    WindowOpt,
    app,
    check_int,
    check_mix,
    check_out_targets,
    run_guarded,
)
from dsim.errors import InputError
from dsim.figures import context_line
from dsim.scenario import build_workload, engine_config, method_spec

# The embedded default trace (600 requests, ~6 req/s) is light for an 8-GPU node of a
# DeepSeek-V4-class model; the default plan scenario replays it at this arrival-rate multiplier
# so that MTP-1 needs more than one node at p50=20ms. Said in the output when applied.
DEFAULT_PLAN_RATE_SCALE = 20.0

# Options of the node-count search, shared by plan and ab.
ScenarioOpt = Annotated[
    str,
    typer.Option(
        help="default (the default profile, DeepSeek-V4-Flash on 8 x H200, and the default trace at "
        "20x its rate) or measured (the first measured profile under profiles/h200/)"
    ),
]
MaxNodesOpt = Annotated[int, typer.Option(help="largest node count tried")]
SeedsOpt = Annotated[str, typer.Option(help="seeds; every one is simulated, the worst counts")]
MarginOpt = Annotated[
    float, typer.Option(help="safety margin: pass only if every metric is within target x (1 - margin)")
]
PriceOpt = Annotated[
    Optional[float],
    typer.Option(help="$ per GPU-hour (default: the public on-demand quote for the profile's GPU kind, dsim.prices)"),
]
JobsOpt = Annotated[Optional[int], typer.Option(help="worker processes (default: CPU count)")]
# The concurrency sweep's options, shared by sweep and ab.
ConcurrencyOpt = Annotated[str, typer.Option(help="comma-separated concurrency levels of the sweep")]
RequestsPerUserOpt = Annotated[int, typer.Option(help="sweep: requests per point = max(N x C, --min-requests)")]
MinRequestsOpt = Annotated[int, typer.Option(help="sweep: fewest requests per point")]
# Where the simulations run (plan, sweep, ab): dsim.executor.
ExecutorOpt = Annotated[
    str, typer.Option("--executor", help="local (worker processes) or ray (Ray tasks; pip install -e '.[ray]')")
]
RayAddressOpt = Annotated[
    Optional[str],
    typer.Option(
        "--ray-address",
        help="--executor ray: the cluster to "
        "join (HOST:PORT, ray://HOST:PORT or auto; default: "
        "$RAY_ADDRESS, else a local Ray started for the run)",
    ),
]
# The paper's comparison (dsim.frontier), printed and plotted by sweep and ab.
UserSlaOpt = Annotated[
    Optional[str],
    typer.Option(
        help="per-user speed SLAs (tok/s/user) for the throughput "
        "gain, e.g. 80,120 (default: the DSpark paper's anchors "
        "for the model: V4-Pro 35,50, otherwise V4-Flash's 80,120)"
    ),
]
PerGpuOpt = Annotated[
    bool,
    typer.Option(
        "--per-gpu",
        help="--concurrency values are per GPU (the DSpark paper's Fig. 8 axis), multiplied by the fleet's GPUs",
    ),
]


def _int_items(s: str, what: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4]; an empty item (1,,2) or a non-integer is an error."""
    parts = [x.strip() for x in s.split(",")]
    if parts and parts[-1] == "" and len(parts) > 1:  # a trailing comma is harmless
        parts = parts[:-1]
    if not s.strip():
        raise InputError(f"{what}: no values given")
    try:
        out = []
        for x in parts:
            if not x:
                raise InputError(f"{what}: empty item in {s!r}")
            out.append(int(x))
    except ValueError:
        raise InputError(f"{what}: expected comma-separated integers, got {s!r}") from None
    return out


def parse_seeds(s: str) -> list[int]:
    out = _int_items(s, "--seeds")
    if not out:
        raise InputError("--seeds: no seeds given")
    if any(x < 0 for x in out):
        raise InputError(f"--seeds: must be >= 0, got {s!r}")
    if len(set(out)) != len(out):
        raise InputError(f"--seeds: repeated seed in {s!r}")
    return out


def parse_methods(s: str, **common) -> dict:
    toks = [t.strip() for t in s.split(",") if t.strip()]
    if not toks:
        raise InputError("--methods: no methods given")
    out = {}
    for t in toks:
        if t.lower() in out:
            raise InputError(f"--methods: {t!r} given twice")
        out[t.lower()] = method_spec(t, **common)
    return out


MAX_CONCURRENCY = 1 << 16


def parse_int_list(s: str, what: str, hi: int = MAX_CONCURRENCY) -> list[int]:
    out = _int_items(s, what)
    if not out or any(x < 1 or x > hi for x in out):
        raise InputError(f"{what}: expected integers in 1..{hi}, got {s!r}")
    if len(set(out)) != len(out):
        raise InputError(f"{what}: repeated value in {s!r}")
    return out


def per_gpu_concurrency(conc: list[int], profile, nodes: int, gpus_per_node: int) -> list[int]:
    """--per-gpu: the total users of each per-GPU level on the fleet, each within MAX_CONCURRENCY."""
    from dsim import frontier as F

    total = F.concurrency_from_per_gpu(conc, profile, nodes, gpus_per_node)
    g = F.fleet_gpus(profile, nodes, gpus_per_node)
    if max(total) > MAX_CONCURRENCY:
        raise InputError(
            f"--concurrency: {max(conc)} users per GPU x {g} GPUs (--per-gpu) is {max(total)} users, "
            f"at most {MAX_CONCURRENCY}"
        )
    return total


def check_common(*, nodes=None, max_nodes=None, gpus_per_node=None, seed=None, jobs=None) -> None:
    """Bounds of the flags plan, sweep and ab share (before anything runs)."""
    from dsim.sim import MAX_GPUS_PER_NODE, MAX_NODES

    check_int(nodes, "--nodes", 1, MAX_NODES)
    check_int(max_nodes, "--max-nodes", 1, MAX_NODES)
    check_int(gpus_per_node, "--gpus-per-node", 1, MAX_GPUS_PER_NODE)
    check_int(seed, "--seed", 0)
    check_int(jobs, "--jobs", 1, 1024)


def check_fit(
    workloads, profile, specs, gpus_per_node: int, price: float | None = None, *, nodes: int, nodes_flag: str
) -> None:
    """The profile fits a node, the largest fleet (``nodes``, from the flag ``nodes_flag``) stays
    within a simulation's replicas, and every request fits its context and KV cache, for every
    method (fail fast, before the worker processes start)."""
    import math

    from dsim.sim import check_fleet, check_requests_fit

    if profile.gpus_per_replica > gpus_per_node:
        raise InputError(
            f"profile {profile.name}: needs {profile.gpus_per_replica} GPUs per replica, "
            f"a node has {gpus_per_node} (--gpus-per-node)"
        )
    check_fleet(nodes, gpus_per_node, profile, nodes_flag)
    if price is not None and not (math.isfinite(price) and price > 0):
        raise InputError(f"--price-per-gpu-hour: must be a finite number > 0, got {price}")
    for w in workloads:
        for sp in specs:
            check_requests_fit(w, profile, sp)


def measured_profile_path() -> Path | None:
    """The first measured profile under profiles/h200/ (by file name), if any."""
    import yaml

    from dsim.cost import PROFILE_DIR

    d = Path(PROFILE_DIR) / "h200"
    if not d.is_dir():
        return None
    for p in sorted(d.glob("*.yaml")):
        try:
            prov = (yaml.safe_load(p.read_text()) or {}).get("provenance") or {}
        except Exception:  # noqa: BLE001 - a broken file is simply not offered
            continue
        if prov.get("kind") == "measured":
            return p
    return None


def resolve_scenario(
    scenario: str, trace: str, profile: Optional[str], rate: Optional[float], rate_scale: Optional[float]
):
    """(profile name/path, rate_scale, notes) for a scenario: 'default' or 'measured'."""
    notes = []
    if scenario not in ("default", "measured"):
        raise InputError(f"--scenario: must be default or measured, got {scenario!r}")
    if scenario == "measured":
        p = measured_profile_path()
        if p is None:
            raise InputError("--scenario measured: no measured profile under profiles/h200/ yet")
        if profile is None:
            profile = str(p)
            notes.append(f"scenario 'measured': profile {p}")
    elif trace == "default" and rate is None and rate_scale is None and profile is None:
        rate_scale = DEFAULT_PLAN_RATE_SCALE
        notes.append(
            f"default scenario: the embedded default trace replayed at {DEFAULT_PLAN_RATE_SCALE:g}x its "
            f"arrival rate (--rate-scale {DEFAULT_PLAN_RATE_SCALE:g}) so one 8-GPU node is not enough"
        )
    return profile, rate_scale, notes


def engine_notes(eng) -> list:
    """What the engine mode assumes, for the printed output (nothing for the default engine)."""
    if eng is None or not eng.disaggregated:
        return []
    from dsim.scenario import disaggregation_note

    return [disaggregation_note(eng.remote_prefill_ms, eng.remote_prefill_ms_per_ktok)]


# ---- plan -----------------------------------------------------------------------------------


@app.command()
def plan(
    sla: str = typer.Option(
        ...,
        help="SLA: comma-separated [metric_]pNN=VALUE (metric tpot (default), ttft, "
        "itl, e2e; VALUE with unit ms or s) and min_user_tok_s=VALUE, e.g. p50=20ms,ttft_p99=2s",
    ),
    trace: TraceOpt = "default",
    format: FormatOpt = "auto",
    requests: RequestsOpt = None,
    window: WindowOpt = None,
    rate: RateOpt = None,
    rate_scale: RateScaleOpt = None,
    mix: MixOpt = None,
    profile: ProfileOpt = None,
    scenario: ScenarioOpt = "default",
    methods: str = typer.Option("mtp,dspark", help="methods to size (first = baseline, last = candidate)"),
    max_nodes: MaxNodesOpt = 64,
    seeds: SeedsOpt = "0,1,2",
    margin: MarginOpt = 0.10,
    price_per_gpu_hour: PriceOpt = None,
    gpus_per_node: GpusPerNodeOpt = 8,
    router: str = typer.Option("least_outstanding"),
    jobs: JobsOpt = None,
    as_json: bool = typer.Option(False, "--json"),
    executor: ExecutorOpt = "local",
    ray_address: RayAddressOpt = None,
    disaggregated: DisaggregatedOpt = False,
    remote_prefill_ms: RemotePrefillMsOpt = 0.0,
    remote_prefill_ms_per_ktok: RemotePrefillPerKtokOpt = 0.0,
):
    """Fewest nodes per method that meet an SLA on a fixed open-loop trace, and what they cost.

    Exit codes: 0 when every method met the SLA within --max-nodes; 1 when some method could not
    (the table says "not met at N nodes" and shows the best reached); 2 for bad input.
    """

    def go():
        from dsim import plan as P
        from dsim.progress import Progress

        setup = _search_setup(
            sla=sla,
            seeds=seeds,
            workload=dict(trace=trace, fmt=format, requests=requests, window=window, rate=rate, mix=mix),
            rate_scale=rate_scale,
            profile=profile,
            scenario=scenario,
            checks=dict(max_nodes=max_nodes, gpus_per_node=gpus_per_node, jobs=jobs),
            executor=executor,
            ray_address=ray_address,
            engine=engine_config(disaggregated, remote_prefill_ms, remote_prefill_ms_per_ktok),
        )
        specs = parse_methods(methods)
        check_fit(setup.workloads.values(), setup.profile, specs.values(), gpus_per_node, price_per_gpu_hour,
                  nodes=max_nodes, nodes_flag="--max-nodes")  # fmt: skip
        with Progress("plan") as bar:
            res = P.plan(
                setup.workloads,
                setup.profile,
                specs,
                setup.slos,
                margin=margin,
                max_nodes=max_nodes,
                seeds=setup.seeds,
                gpus_per_node=gpus_per_node,
                price=price_per_gpu_hour,
                jobs=jobs,
                router=router,
                notes=setup.notes,
                executor=executor,
                ray_address=ray_address,
                progress_bar=bar,
                engine=setup.engine,
            )
        if as_json:
            typer.echo(json.dumps(res, sort_keys=True, default=_json_default))
        else:
            typer.echo(P.format_plan(res, setup.slos, list(specs)))
        return 0 if all(res[n]["sla_met"] for n in specs) else 1

    rc = run_guarded(go)
    if rc:
        raise typer.Exit(rc)


@dataclass(frozen=True)
class SearchSetup:
    """What plan and ab share before the node-count search: the parsed SLA and seeds, the engine
    mode, the profile and one workload per seed (the scenario resolved), and the printed notes."""

    slos: list
    seeds: list[int]
    engine: Any  # EngineConfig, or None for the default engine
    profile: Any  # dsim.cost.Profile
    workloads: dict
    notes: list[str]


def _search_setup(
    *, sla, seeds, workload: dict, rate_scale, profile, scenario, checks: dict, executor, ray_address, engine
) -> SearchSetup:
    """Validate the node-count search's shared flags (an InputError names the flag) and build its
    inputs. workload: build_workload's trace, fmt, requests, window, rate and mix; checks:
    check_common's max_nodes, gpus_per_node and jobs."""
    from dsim import plan as P
    from dsim.cost import load_profile
    from dsim.executor import check_executor

    check_executor(executor, ray_address)
    slos = P.parse_sla(sla)
    seed_list = parse_seeds(seeds)
    check_common(**checks)
    check_mix(workload["mix"])
    prof_name, rs, notes = resolve_scenario(scenario, workload["trace"], profile, workload["rate"], rate_scale)
    notes += engine_notes(engine)
    prof = load_profile(prof_name)
    wls = {s: build_workload(**workload, rate_scale=rs, seed=s) for s in seed_list}
    return SearchSetup(slos=slos, seeds=seed_list, engine=engine, profile=prof, workloads=wls, notes=notes)


def _json_default(o):
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serializable: {type(o)}")


# ---- sweep ----------------------------------------------------------------------------------


@app.command()
def sweep(
    concurrency: ConcurrencyOpt = "1,2,4,8,16,32,64,128,256",
    methods: str = typer.Option(
        "none,mtp,block,dspark",
        help="methods (none, mtp, mtpK, eagle3, block, dspark, dspark-fixed, dsparkK, dsparkK-fixed)",
    ),
    requests_per_user: RequestsPerUserOpt = 8,
    min_requests: MinRequestsOpt = 200,
    trace: TraceOpt = "default",
    format: FormatOpt = "auto",
    window: WindowOpt = None,
    mix: MixOpt = None,
    profile: ProfileOpt = None,
    nodes: int = typer.Option(1),
    gpus_per_node: GpusPerNodeOpt = 8,
    seed: int = typer.Option(0),
    jobs: JobsOpt = None,
    out: str = typer.Option(..., help="output directory: sweep.csv and PNG figures"),
    executor: ExecutorOpt = "local",
    ray_address: RayAddressOpt = None,
    user_sla: UserSlaOpt = None,
    per_gpu: PerGpuOpt = False,
    disaggregated: DisaggregatedOpt = False,
    remote_prefill_ms: RemotePrefillMsOpt = 0.0,
    remote_prefill_ms_per_ktok: RemotePrefillPerKtokOpt = 0.0,
):
    """Closed-loop concurrency sweep: throughput per GPU vs per-user speed (frontier), Fig. 8 curves."""

    def go():
        from dsim import frontier as F
        from dsim import sweep as S
        from dsim.cost import load_profile
        from dsim.executor import check_executor
        from dsim.outputs import field_lines, final_path, staged_dir
        from dsim.progress import Progress

        check_executor(executor, ray_address)
        conc = parse_int_list(concurrency, "--concurrency")
        specs = parse_methods(methods)
        eng = engine_config(disaggregated, remote_prefill_ms, remote_prefill_ms_per_ktok)
        slas = F.parse_user_sla(user_sla) if user_sla is not None else None
        check_int(min_requests, "--min-requests", 1, 10_000_000)
        check_int(requests_per_user, "--requests-per-user", 1, 1_000_000)
        check_common(nodes=nodes, gpus_per_node=gpus_per_node, seed=seed, jobs=jobs)
        check_mix(mix)
        check_out_targets(out)
        prof = load_profile(profile)
        base = build_workload(trace, format, None, window, None, None, None, mix, seed)
        check_fit([base], prof, specs.values(), gpus_per_node, nodes=nodes, nodes_flag="--nodes")
        if per_gpu:
            conc = per_gpu_concurrency(conc, prof, nodes, gpus_per_node)
        with staged_dir(out) as tmp:
            with Progress("sweep") as bar:
                df = S.sweep(
                    base,
                    prof,
                    specs,
                    conc,
                    requests_per_user=requests_per_user,
                    min_requests=min_requests,
                    nodes=nodes,
                    gpus_per_node=gpus_per_node,
                    seed=seed,
                    jobs=jobs,
                    executor=executor,
                    ray_address=ray_address,
                    progress_bar=bar,
                    engine=eng,
                )
            ctx = context_line(prof, base.source, list(dict.fromkeys(df["label"])))
            written = S.write_sweep(df, tmp, context=ctx)
            comp_text, comp_files = _paper_comparison(df, list(specs), slas, prof, tmp, ctx)
            files = [final_path(tmp, out, f) for f in written + comp_files]
        typer.echo(S.format_sweep(df))
        if comp_text:
            typer.echo(comp_text)
        typer.echo("\n".join(field_lines("workload: ", base.source) + field_lines("profile : ", prof.label)))
        for line in engine_notes(eng):
            typer.echo(f"engine  : {line}")
        typer.echo("wrote " + ", ".join(str(f) for f in files))

    run_guarded(go)


def user_slas(slas, prof):
    """(SLA anchors, where they come from) for a profile: given, or the paper's for its model."""
    from dsim import frontier as F

    if slas is not None:
        return tuple(slas), "given with --user-sla"
    return F.default_user_sla(prof.provenance.get("model"))


def _paper_comparison(df, methods, slas, prof, out, context="") -> tuple[str, list]:
    """(printed comparison, figure files) for the pair the paper compares; ("", []) for one method."""
    from dsim import frontier as F

    pair = F.pick_pair(methods)
    if pair is None:
        return "", []
    anchors, src = user_slas(slas, prof)
    c = F.paper_comparison(df, pair[0], pair[1], anchors, src)
    return F.format_comparison(c), F.plot_comparison(df, c, out, context=context)


# ---- ab -------------------------------------------------------------------------------------

EXAMPLE_AB_COMMAND = "dsim ab --a mtp --b dspark --sla p50=20ms --out reports/example-ab"


@app.command()
def ab(
    a: str = typer.Option("mtp", "--a", help="method A (baseline)"),
    b: str = typer.Option("dspark", "--b", help="method B (candidate)"),
    sla: str = typer.Option("p50=20ms", help="SLA for the node-count comparison (grammar of `dsim plan`)"),
    trace: TraceOpt = "default",
    format: FormatOpt = "auto",
    requests: RequestsOpt = None,
    window: WindowOpt = None,
    rate: RateOpt = None,
    rate_scale: RateScaleOpt = None,
    mix: MixOpt = None,
    profile: ProfileOpt = None,
    scenario: ScenarioOpt = "default",
    max_nodes: MaxNodesOpt = 64,
    seeds: SeedsOpt = "0,1,2",
    margin: MarginOpt = 0.10,
    price_per_gpu_hour: PriceOpt = None,
    gpus_per_node: GpusPerNodeOpt = 8,
    concurrency: ConcurrencyOpt = "1,2,4,8,16,32,64,128,256",
    requests_per_user: RequestsPerUserOpt = 8,
    min_requests: MinRequestsOpt = 200,
    jobs: JobsOpt = None,
    out: str = typer.Option(..., help="report directory (report.md, report.html, PNGs, plan.json, sweep.csv)"),
    executor: ExecutorOpt = "local",
    ray_address: RayAddressOpt = None,
    user_sla: UserSlaOpt = None,
    per_gpu: PerGpuOpt = False,
    disaggregated: DisaggregatedOpt = False,
    remote_prefill_ms: RemotePrefillMsOpt = 0.0,
    remote_prefill_ms_per_ktok: RemotePrefillPerKtokOpt = 0.0,
):
    """Side-by-side report of method A vs B: SLA node counts, latency CDFs, frontier, per class, sensitivity."""

    def go():
        from dsim import frontier as F
        from dsim.outputs import final_path, staged_dir
        from dsim.progress import Progress
        from dsim.report import ab_report

        conc = parse_int_list(concurrency, "--concurrency")
        slas_u = F.parse_user_sla(user_sla) if user_sla is not None else None
        check_int(min_requests, "--min-requests", 1, 10_000_000)
        check_int(requests_per_user, "--requests-per-user", 1, 1_000_000)
        check_out_targets(out)
        setup = _search_setup(
            sla=sla,
            seeds=seeds,
            workload=dict(trace=trace, fmt=format, requests=requests, window=window, rate=rate, mix=mix),
            rate_scale=rate_scale,
            profile=profile,
            scenario=scenario,
            checks=dict(max_nodes=max_nodes, gpus_per_node=gpus_per_node, jobs=jobs),
            executor=executor,
            ray_address=ray_address,
            engine=engine_config(disaggregated, remote_prefill_ms, remote_prefill_ms_per_ktok),
        )
        sa, sb = method_spec(a, what="--a"), method_spec(b, what="--b")
        check_fit(setup.workloads.values(), setup.profile, (sa, sb), gpus_per_node, price_per_gpu_hour,
                  nodes=max_nodes, nodes_flag="--max-nodes")  # fmt: skip
        if per_gpu:
            conc = per_gpu_concurrency(conc, setup.profile, 1, gpus_per_node)
        argv = sys.argv[1:]
        cmd = (
            ("dsim " + " ".join(_shq(x) for x in argv))
            if argv and argv[0] == "ab"
            else f"dsim ab --a {a} --b {b} --sla {sla} --out {out}"
        )
        with staged_dir(out) as tmp:
            with Progress("ab") as bar:
                files = ab_report(
                    setup.workloads,
                    setup.profile,
                    sa,
                    sb,
                    setup.slos,
                    tmp,
                    command=cmd,
                    margin=margin,
                    max_nodes=max_nodes,
                    seeds=setup.seeds,
                    gpus_per_node=gpus_per_node,
                    price=price_per_gpu_hour,
                    jobs=jobs,
                    concurrency=conc,
                    requests_per_user=requests_per_user,
                    min_requests=min_requests,
                    notes=setup.notes,
                    name_a=a.lower(),
                    name_b=b.lower(),
                    executor=executor,
                    ray_address=ray_address,
                    progress_bar=bar,
                    user_sla=slas_u,
                    engine=setup.engine,
                )
            files = [final_path(tmp, out, f) for f in files]
        typer.echo("wrote " + ", ".join(str(f) for f in files))

    run_guarded(go)


def _shq(s: str) -> str:
    import shlex

    return shlex.quote(s)
