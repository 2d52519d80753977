"""`dsim plan`, `dsim sweep`, `dsim ab`: registered on dsim.cli.app's typer app (dsim.cli.entry imports this
module; dsim.cli.app does not)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from dsim.cli.app import (
    app,
    check_int,
    check_mix_methods,
    check_out_targets,
    run_guarded,
    scenario_options,
)
from dsim.errors import InputError
from dsim.scenario import (
    Scenario,
    ScenarioSource,
    build_workload,
    method_spec,
    resolve_presets,
    scenario_engine,
    scenario_profile,
    spec_common,
)
from dsim.study.figures import context_line

# Options of plan, sweep and ab that are not scenario options (how the simulations run).
JobsOpt = Annotated[Optional[int], typer.Option(help="worker processes (default: CPU count)")]
# The concurrency sweep's options, shared by sweep and ab.
ConcurrencyOpt = Annotated[str, typer.Option(help="comma-separated concurrency levels of the sweep")]
RequestsPerUserOpt = Annotated[int, typer.Option(help="sweep: requests per point = max(N x C, --min-requests)")]
MinRequestsOpt = Annotated[int, typer.Option(help="sweep: fewest requests per point")]
# Where the simulations run (plan, sweep, ab): dsim.study.executor.
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
# The paper's comparison (dsim.study.frontier), printed and plotted by sweep and ab.
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
    from dsim.study import frontier as F

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
    from dsim.sim import check_fleet, check_requests_fit
    from dsim.study.prices import price_for

    if profile.gpus_per_replica > gpus_per_node:
        raise InputError(
            f"profile {profile.name}: needs {profile.gpus_per_replica} GPUs per replica, "
            f"a node has {gpus_per_node} (--gpus-per-node)"
        )
    check_fleet(nodes, gpus_per_node, profile, nodes_flag)
    if price is not None:
        price_for(None, price)  # (its check of a given price)
    for w in workloads:
        for sp in specs:
            check_requests_fit(w, profile, sp)


def engine_notes(eng) -> list:
    """What the engine mode assumes, for the printed output (nothing for the default engine)."""
    if eng is None or not eng.disaggregated:
        return []
    from dsim.scenario import disaggregation_note

    return [disaggregation_note(eng.remote_prefill_ms, eng.remote_prefill_ms_per_ktok)]


# ---- plan -----------------------------------------------------------------------------------


@app.command()
@scenario_options("plan")
def plan(
    jobs: JobsOpt = None,
    as_json: bool = typer.Option(False, "--json"),
    executor: ExecutorOpt = "local",
    ray_address: RayAddressOpt = None,
    *,
    scn: Scenario,
    scn_source: ScenarioSource,
):
    """Fewest nodes per method that meet an SLA on a fixed open-loop trace, and what they cost.

    Exit codes: 0 when every method met the SLA within --max-nodes; 1 when some method could not
    (the table says "not met at N nodes" and shows the best reached); 2 for bad input.
    """

    def go():
        from dsim.scenario import scenario_yaml
        from dsim.study import capacity as P
        from dsim.study.progress import Progress

        specs = parse_methods(scn.methods, **spec_common(scn))
        setup = _search_setup(scn, scn_source, "plan", [sp.method for sp in specs.values()], jobs=jobs,
                              executor=executor, ray_address=ray_address)  # fmt: skip
        check_fit(setup.workloads.values(), setup.profile, specs.values(), scn.gpus_per_node,
                  scn.price_per_gpu_hour, nodes=scn.max_nodes, nodes_flag="--max-nodes")  # fmt: skip
        with Progress("plan") as bar:
            res = P.plan(
                setup.workloads,
                setup.profile,
                specs,
                setup.slos,
                margin=scn.margin,
                max_nodes=scn.max_nodes,
                seeds=setup.seeds,
                gpus_per_node=scn.gpus_per_node,
                price=scn.price_per_gpu_hour,
                jobs=jobs,
                router=scn.router,
                notes=setup.notes,
                executor=executor,
                ray_address=ray_address,
                progress_bar=bar,
                engine=setup.engine,
            )
        res["assumptions"]["scenario"] = setup.scenario.to_dict("plan")
        if as_json:
            typer.echo(json.dumps(res, sort_keys=True, default=_json_default))
        else:
            typer.echo(P.format_plan(res, setup.slos, list(specs)))
            typer.echo("")
            typer.echo(
                scenario_yaml(setup.scenario, "plan", comments=False, header=reproduce(scn_source, "plan")), nl=False
            )
        return 0 if all(res[n]["sla_met"] for n in specs) else 1

    rc = run_guarded(go)
    if rc:
        raise typer.Exit(rc)


def reproduce(src: ScenarioSource, command: str) -> list[str]:
    """The header of a scenario printed under a result (saved as FILE.yaml, it reproduces it)."""
    from dsim.scenario import reproduce_header

    return [f"scenario (save these lines as FILE.yaml; {reproduce_header(command, src, 'FILE.yaml')[1]})"]


@dataclass(frozen=True)
class SearchSetup:
    """What plan and ab share before the node-count search: the parsed SLA and seeds, the engine
    mode, the profile and one workload per seed (the scenario resolved: every value explicit),
    and the printed notes."""

    slos: list
    seeds: list[int]
    engine: Any  # EngineConfig, or None for the default engine
    profile: Any  # dsim.cost.Profile
    workloads: dict
    notes: list[str]
    scenario: Scenario


def _search_setup(
    scn: Scenario, src: ScenarioSource, command: str, methods: list[str], *, jobs, executor, ray_address
) -> SearchSetup:
    """Validate the node-count search's scenario and flags (an InputError names the flag) for
    ``methods`` (SpecMethod names) and build its inputs."""
    from dsim.study.executor import check_executor
    from dsim.study.sla import parse_sla

    check_executor(executor, ray_address)
    if scn.sla is None:
        raise InputError("--sla: required (on the command line or as sla: in the --scenario file)")
    slos = parse_sla(scn.sla)
    seed_list = parse_seeds(scn.seeds)
    check_common(max_nodes=scn.max_nodes, gpus_per_node=scn.gpus_per_node, jobs=jobs)
    check_mix_methods(scn.mix, scn.acceptance, methods)
    run, notes = resolve_presets(scn, src, command)
    eng = scenario_engine(run)
    notes += engine_notes(eng)
    prof = scenario_profile(run)
    wls = {
        s: build_workload(run.trace, run.format, run.requests, run.window, run.rate, run.rate_scale, None, run.mix, s)
        for s in seed_list
    }
    return SearchSetup(slos=slos, seeds=seed_list, engine=eng, profile=prof, workloads=wls, notes=notes, scenario=run)


def _json_default(o):
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serializable: {type(o)}")


# ---- sweep ----------------------------------------------------------------------------------


@app.command()
@scenario_options("sweep")
def sweep(
    concurrency: ConcurrencyOpt = "1,2,4,8,16,32,64,128,256",
    requests_per_user: RequestsPerUserOpt = 8,
    min_requests: MinRequestsOpt = 200,
    nodes: int = typer.Option(1),
    seed: int = typer.Option(0),
    jobs: JobsOpt = None,
    out: str = typer.Option(..., help="output directory: sweep.csv, PNG figures and scenario.yaml"),
    executor: ExecutorOpt = "local",
    ray_address: RayAddressOpt = None,
    user_sla: UserSlaOpt = None,
    per_gpu: PerGpuOpt = False,
    *,
    scn: Scenario,
    scn_source: ScenarioSource,
):
    """Closed-loop concurrency sweep: throughput per GPU vs per-user speed (frontier), Fig. 8 curves."""

    def go():
        from dsim.outputs import field_lines, final_path, staged_dir
        from dsim.scenario import write_scenario
        from dsim.study import frontier as F
        from dsim.study import sweep as S
        from dsim.study.executor import check_executor
        from dsim.study.progress import Progress

        check_executor(executor, ray_address)
        conc = parse_int_list(concurrency, "--concurrency")
        specs = parse_methods(scn.methods, **spec_common(scn))
        run, notes = resolve_presets(scn, scn_source, "sweep")
        eng = scenario_engine(run)
        slas = F.parse_user_sla(user_sla) if user_sla is not None else None
        check_int(min_requests, "--min-requests", 1, 10_000_000)
        check_int(requests_per_user, "--requests-per-user", 1, 1_000_000)
        check_common(nodes=nodes, gpus_per_node=run.gpus_per_node, seed=seed, jobs=jobs)
        check_mix_methods(run.mix, run.acceptance, [sp.method for sp in specs.values()])
        check_out_targets(out)
        prof = scenario_profile(run)
        base = build_workload(run.trace, run.format, None, run.window, None, None, None, run.mix, seed)
        check_fit([base], prof, specs.values(), run.gpus_per_node, nodes=nodes, nodes_flag="--nodes")
        if per_gpu:
            conc = per_gpu_concurrency(conc, prof, nodes, run.gpus_per_node)
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
                    gpus_per_node=run.gpus_per_node,
                    seed=seed,
                    jobs=jobs,
                    executor=executor,
                    ray_address=ray_address,
                    progress_bar=bar,
                    engine=eng,
                    router=run.router,
                )
            ctx = context_line(prof, base, list(dict.fromkeys(df["label"])))
            written = S.write_sweep(df, tmp, context=ctx)
            comp_text, comp_files = _paper_comparison(df, list(specs), slas, prof, tmp, ctx)
            written_scn = write_scenario(tmp, run, "sweep", scn_source, out)
            files = [final_path(tmp, out, f) for f in written + comp_files + [written_scn]]
        typer.echo(S.format_sweep(df))
        if comp_text:
            typer.echo(comp_text)
        typer.echo("\n".join(field_lines("workload: ", base.source) + field_lines("profile : ", prof.label)))
        for line in method_lines(specs, prof):
            typer.echo(f"method  : {line}")
        for line in notes:
            typer.echo(f"note    : {line}")
        for line in engine_notes(eng):
            typer.echo(f"engine  : {line}")
        typer.echo("wrote " + ", ".join(str(f) for f in files))

    run_guarded(go)


def method_lines(specs: dict, prof) -> list[str]:
    """Per drafting method: the acceptance it is sized on (whose) and, where the profile's model
    cannot run it, that it is hypothetical, or where that is unknown, that it was not checked
    (dsim.spec.capability)."""
    from dsim.study import capacity as P

    out = []
    for name, sp in specs.items():
        f = P.method_fit_fields(sp, prof)
        if f["acceptance_origin"] is None:
            continue
        line = f"{name}: acceptance {f['acceptance_origin']}"
        if f["hypothetical"]:
            line += f"; hypothetical: {f['fit']}"
        elif f["model_can_run"] is None and f["fit"]:
            line += f"; {f['fit']}; not checked"
        out.append(line)
    return out


def user_slas(slas, prof):
    """(SLA anchors, where they come from) for a profile: given, or the paper's for its model."""
    from dsim.study import frontier as F

    if slas is not None:
        return tuple(slas), "given with --user-sla"
    return F.default_user_sla(prof.provenance.get("model"))


def _paper_comparison(df, methods, slas, prof, out, context="") -> tuple[str, list]:
    """(printed comparison, figure files) for the pair the paper compares; ("", []) for one method."""
    from dsim.study import frontier as F

    pair = F.pick_pair(methods)
    if pair is None:
        return "", []
    anchors, src = user_slas(slas, prof)
    c = F.paper_comparison(df, pair[0], pair[1], anchors, src)
    return F.format_comparison(c), F.plot_comparison(df, c, out, context=context)


# ---- ab -------------------------------------------------------------------------------------

EXAMPLE_AB_COMMAND = "dsim ab --a mtp --b dspark --sla p50=20ms --out reports/example-ab"


@app.command()
@scenario_options("ab")
def ab(
    a: str = typer.Option("mtp", "--a", help="method A (baseline)"),
    b: str = typer.Option("dspark", "--b", help="method B (candidate)"),
    concurrency: ConcurrencyOpt = "1,2,4,8,16,32,64,128,256",
    requests_per_user: RequestsPerUserOpt = 8,
    min_requests: MinRequestsOpt = 200,
    jobs: JobsOpt = None,
    out: str = typer.Option(
        ..., help="report directory (report.md, report.html, PNGs, plan.json, sweep.csv, scenario.yaml)"
    ),
    executor: ExecutorOpt = "local",
    ray_address: RayAddressOpt = None,
    user_sla: UserSlaOpt = None,
    per_gpu: PerGpuOpt = False,
    *,
    scn: Scenario,
    scn_source: ScenarioSource,
):
    """Side-by-side report of method A vs B: SLA node counts, latency CDFs, frontier, per class, sensitivity."""

    def go():
        from dsim.outputs import final_path, staged_dir
        from dsim.scenario import SCENARIO_FILE, write_scenario
        from dsim.study import frontier as F
        from dsim.study.progress import Progress
        from dsim.study.report import ab_report

        conc = parse_int_list(concurrency, "--concurrency")
        slas_u = F.parse_user_sla(user_sla) if user_sla is not None else None
        check_int(min_requests, "--min-requests", 1, 10_000_000)
        check_int(requests_per_user, "--requests-per-user", 1, 1_000_000)
        check_out_targets(out)
        common = spec_common(scn)
        sa, sb = method_spec(a, what="--a", **common), method_spec(b, what="--b", **common)
        setup = _search_setup(scn, scn_source, "ab", [sa.method, sb.method], jobs=jobs, executor=executor,
                              ray_address=ray_address)  # fmt: skip
        check_fit(setup.workloads.values(), setup.profile, (sa, sb), scn.gpus_per_node, scn.price_per_gpu_hour,
                  nodes=scn.max_nodes, nodes_flag="--max-nodes")  # fmt: skip
        if per_gpu:
            conc = per_gpu_concurrency(conc, setup.profile, 1, scn.gpus_per_node)
        argv = sys.argv[1:]
        cmd = (
            ("dsim " + " ".join(_shq(x) for x in argv))
            if argv and argv[0] == "ab"
            else f"dsim ab --a {a} --b {b} --sla {scn.sla} --out {out}"
        )
        # the second line: every option in the scenario file written beside the report
        rest = " ".join(_shq(x) for x in scn_source.other_options)
        cmd += f"\n# or: dsim ab --scenario {_shq(str(Path(out) / SCENARIO_FILE))}" + (f" {rest}" if rest else "")
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
                    margin=scn.margin,
                    max_nodes=scn.max_nodes,
                    seeds=setup.seeds,
                    gpus_per_node=scn.gpus_per_node,
                    price=scn.price_per_gpu_hour,
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
                    router=scn.router,
                )
            files.append(write_scenario(tmp, setup.scenario, "ab", scn_source, out))
            files = [final_path(tmp, out, f) for f in files]
        typer.echo("wrote " + ", ".join(str(f) for f in files))

    run_guarded(go)


def _shq(s: str) -> str:
    import shlex

    return shlex.quote(s)
