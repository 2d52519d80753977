"""The `dsim` command line (typer): the app, the options the workload-driven commands share, and
`dsim simulate`. The planning commands (dsim.cli.plan_cli) and plugged-in command groups (dsim.cli.entry)
register themselves on `app`; this module imports neither.

Every command turns bad input (InputError) into one line on stderr and exit code 2.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import errno
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from dsim.errors import InputError
from dsim.scenario import build_workload, disaggregation_note, spec_config

if TYPE_CHECKING:
    from dsim.engine.config import EngineConfig

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="dsim: size LLM serving fleets that run speculative decoding (MTP, EAGLE-3, block drafters, DSpark).",
)


@app.callback()
def _root():
    """dsim: size LLM serving fleets that run speculative decoding."""


# The scenario source of the command running (set by scenario_options): an error naming a scenario
# option whose value came from a scenario file names the file's line and key (dsim.scenario.file_marked).
_SCENARIO_SOURCE: contextvars.ContextVar = contextvars.ContextVar("dsim_scenario_source", default=None)


def fail(msg: str):
    src = _SCENARIO_SOURCE.get()
    if src is not None:
        from dsim.scenario import file_marked

        msg = file_marked(msg, src)
    typer.echo(f"dsim: error: {msg}", err=True)
    raise typer.Exit(2)


def run_guarded(fn, *a, **kw):
    try:
        return fn(*a, **kw)
    except InputError as e:
        fail(str(e))


# ---- shared option plumbing (used by simulate, plan, sweep, ab) ------------------------------

# The scenario options (what is simulated) are defined once, as the fields of
# dsim.scenario.Scenario; `scenario_options` turns them into each command's options.
ScenarioFileOpt = Annotated[
    Optional[str],
    typer.Option(
        "--scenario",
        help="a scenario file (YAML, `dsim scenario init` writes a template) or a preset: default (the "
        "default profile, DeepSeek-V4-Flash on 8 x H200; plan and ab replay the default trace at 20x its "
        "rate) or measured (the first measured profile under profiles/h200/); options given on the command "
        "line override the file's",
    ),
]


def scenario_options(command: str):
    """Decorator: give a command the scenario options it takes (dsim.scenario.Scenario's fields
    whose ``commands`` name it) and ``--scenario``. The command function receives them resolved
    (its defaults, the scenario file's values, the options given) as ``scn`` (a Scenario) and
    ``scn_source`` (a ScenarioSource with the command-line tokens of its other options given,
    for the line that reproduces a result); a bad value or file is one line and exit code 2."""
    import functools
    import inspect

    from dsim.scenario import default_for, field_types, scenario_fields

    def deco(fn):
        sig = inspect.signature(fn, eval_str=True)
        own = [p for p in sig.parameters.values() if p.name not in ("scn", "scn_source")]
        types = field_types()
        added = []
        for f in scenario_fields(command):
            typ = types[f.name][0]
            d = default_for(f, command)
            shown = f" [default: {str(d).lower() if isinstance(d, bool) else d}]" if d is not None else ""
            decls = (f.metadata.get("flag") or "--" + f.name.replace("_", "-"),)
            opt = typer.Option(*decls, help=f.metadata["help"] + shown, show_default=False)
            added.append(
                inspect.Parameter(
                    f.name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[Optional[typ], opt]
                )
            )
        added.append(
            inspect.Parameter("scenario", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=ScenarioFileOpt)
        )
        added.append(inspect.Parameter("dsim_ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context))
        names = {f.name for f in scenario_fields(command)}

        @functools.wraps(fn)
        def wrapper(**kw):
            from dsim.scenario import resolve_scenario_options

            ctx = kw.pop("dsim_ctx")
            given = {n: kw.pop(n) for n in names}
            scenario = kw.pop("scenario")
            scn, src = run_guarded(resolve_scenario_options, command, given, scenario)
            src = dataclasses.replace(src, other_options=_options_given(ctx, names | {"scenario"} | HOW_IT_RUNS))
            token = _SCENARIO_SOURCE.set(src)
            try:
                return fn(scn=scn, scn_source=src, **kw)
            finally:
                _SCENARIO_SOURCE.reset(token)

        params = own + added
        wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper

    return deco


# Options that say only how the simulations run (worker processes, Ray, the progress bar): the
# results are the same whatever they are, so the line that reproduces a result leaves them out.
HOW_IT_RUNS = frozenset({"jobs", "executor", "ray_address", "progress"})


def _options_given(ctx, skip: set) -> tuple:
    """The command-line tokens of the options given to this command other than ``skip``."""
    out: list = []
    for p in ctx.command.params:
        if p.name in skip or not getattr(p, "opts", None):
            continue
        source = ctx.get_parameter_source(p.name)  # click's ParameterSource (typer carries its own click)
        if source is None or source.name != "COMMANDLINE":
            continue
        v = ctx.params.get(p.name)
        if getattr(p, "is_flag", False):
            if v:
                out.append(p.opts[0])
            elif p.secondary_opts:
                out.append(p.secondary_opts[0])
        else:
            out += [p.opts[0], str(v)]
    return tuple(out)


def check_mix(mix: Optional[str], acceptance: Optional[str] = None, method: Optional[str] = None) -> None:
    """--mix names classes the acceptance curves know: math, code, chat, or those of the
    --acceptance given."""
    if mix is None:
        return
    from dsim.workload import DEFAULT_CLASSES, parse_mix

    shares = parse_mix(mix)
    known = set(DEFAULT_CLASSES)
    if acceptance:
        from dsim.spec.acceptance import load_acceptance

        known |= set(load_acceptance(acceptance, method).classes)
    unknown = [c for c in shares if c not in known]
    if unknown:
        raise InputError(f"--mix: unknown class {unknown[0]!r} (known: {', '.join(sorted(known))})")


def check_mix_methods(mix: Optional[str], acceptance: Optional[str], methods) -> None:
    """check_mix for each method (SpecMethod names): a method without drafts reads no curves, so
    only the default classes; a drafting one the curves of its own method (a preset such as
    deepseek-v4 holds one curve set per method)."""
    if mix is None:
        return
    from dsim.spec.methods import make_method

    for m in dict.fromkeys(methods):
        check_mix(mix, acceptance if make_method(m).drafts else None, m)


def check_int(value, what: str, lo: int, hi: Optional[int] = None) -> None:
    if value is None:
        return
    if value < lo or (hi is not None and value > hi):
        rng = f">= {lo}" if hi is None else f"in {lo}..{hi}"
        raise InputError(f"{what}: must be {rng}, got {value}")


def check_out_targets(out: Optional[Path], step_log: Optional[Path] = None) -> None:
    """Fail before a run when its outputs could not be written."""
    from dsim.outputs import check_apart, check_dir_target, check_file_target

    if out is not None:
        check_dir_target(out, "--out")
    if step_log is not None:
        check_file_target(step_log, "--step-log")
    check_apart((out, "--out"), (step_log, "--step-log"))


def print_summary(s: dict, engine: EngineConfig) -> None:
    """The human-readable summary of one simulation run with this engine configuration."""
    from dsim.engine.diagnostics import format_warnings
    from dsim.outputs import field_lines

    for name, text in (("workload : ", s["setup"]["workload"]), ("profile  : ", s["setup"]["profile"])):
        typer.echo("\n".join(field_lines(name, text)))
    if s["setup"].get("acceptance_source"):
        src = s["setup"]["acceptance_source"]
        typer.echo(f"acceptance: {src if len(src) < 200 else src[:197] + '...'}")
    if s["setup"]["class_mix_assumed"]:
        typer.echo("classes  : workload-class mix is an assumption (the trace carries no classes)")
    typer.echo(
        f"cluster  : {s['setup']['nodes']} node(s), {s['setup']['replicas']} replica(s), "
        f"{s['setup']['gpus']} GPUs; method {s['setup']['spec']['method']} k={s['setup']['spec']['k']}"
    )
    if engine.disaggregated:
        typer.echo("engine   : " + disaggregation_note(engine.remote_prefill_ms, engine.remote_prefill_ms_per_ktok))
    typer.echo(
        f"completed {s['requests_completed']}/{s['requests_total']} requests in {s['sim_time_s']:.1f} s "
        f"simulated ({s['wall_time_s']:.2f} s wall, {s['steps']} steps)"
    )
    typer.echo(
        f"output   : {s['output_tok_s']:.1f} tok/s, {s['output_tok_s_per_gpu']:.1f} tok/s/GPU, "
        f"{s['output_tok_s_per_user'] or 0:.1f} tok/s per user"
    )
    typer.echo(f"{'metric':8} {'mean':>10} {'p50':>10} {'p90':>10} {'p99':>10}  (ms)")
    for m in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        d = s[m]
        typer.echo(
            f"{m[:-3]:8} "
            + " ".join(f"{(d[k] if d[k] is not None else float('nan')):10.2f}" for k in ("mean", "p50", "p90", "p99"))
        )
    for line in format_warnings(s.get("warnings", ())):
        typer.echo(line)
    if s.get("per_position_acceptance"):
        typer.echo(
            f"acceptance length {s['acceptance_length']:.3f}; per position "
            + " ".join(f"{x:.3f}" for x in s["per_position_acceptance"])
            + f"; verify tokens/request/step {s['mean_verify_tokens_per_request']:.2f}"
        )
        if s.get("verify_utilization") is not None:
            typer.echo(
                f"verify utilization {s['verify_utilization']:.3f} (drafts accepted within the chosen "
                f"windows / accepted had the full block been verified; DSpark reports 0.88-0.97)"
            )
        for c, v in s.get("per_class", {}).items():
            typer.echo(
                f"  {c:6} acceptance length {v['acceptance_length']:.3f}, "
                f"verify tokens {v['mean_verify_tokens_per_request']:.2f}"
            )
        if "head" in s:
            typer.echo(f"confidence head ({s['head']['mode']}): AUC {s['head']['auc']:.3f}, ECE {s['head']['ece']:.3f}")


# ---- simulate -------------------------------------------------------------------------------


@app.command()
@scenario_options("simulate")
def simulate(
    nodes: int = typer.Option(1, help="nodes"),
    concurrency: Optional[int] = typer.Option(None, help="closed loop: C users"),
    method: str = typer.Option(
        "none", help="none, mtp, eagle3, block, dspark; or a token of plan's --methods (mtp3, dspark5, dspark5-fixed)"
    ),
    k: Optional[int] = typer.Option(None, "--k", help="drafts per step (default: mtp 1, others 7)"),
    adaptive: Optional[bool] = typer.Option(
        None, "--adaptive/--no-adaptive", help="dspark: confidence-scheduled verification (default on)"
    ),
    slo: Optional[str] = typer.Option(None, help="per-request SLOs for goodput, e.g. ttft=500ms,tpot=20ms"),
    seed: int = typer.Option(0),
    out: Optional[str] = typer.Option(
        None, help="write summary.json, requests.parquet, steps.parquet and scenario.yaml here"
    ),
    step_log: Optional[str] = typer.Option(None, help="write a step-shape log (JSONL) for GPU replay"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as one JSON object"),
    quiet: bool = typer.Option(False, "--quiet"),
    *,
    scn,
    scn_source,
):
    """Replay a trace through a modeled vLLM-style engine and report what a real server would show."""

    def go():
        from dsim.outputs import staged_dir, staged_file
        from dsim.scenario import resolve_presets, scenario_engine, scenario_profile, write_scenario
        from dsim.sim import (
            MAX_GPUS_PER_NODE,
            MAX_NODES,
            SimConfig,
            write_output_files,
            write_step_log_file,
        )
        from dsim.sim import (
            simulate as run,
        )

        check_int(nodes, "--nodes", 1, MAX_NODES)
        check_int(scn.gpus_per_node, "--gpus-per-node", 1, MAX_GPUS_PER_NODE)
        check_int(seed, "--seed", 0)
        from dsim.scenario import method_spec
        from dsim.spec.methods import make_method

        # a --methods token (mtp3, dspark5, dspark5-fixed) names the method and its k / adaptivity;
        # --k and --adaptive, where given, must agree with it
        named = method_spec(method, what="--method")
        if k is not None and named.k is not None and k != named.k:
            raise InputError(f"--k {k}: disagrees with --method {method} (k = {named.k})")
        k_drafts = k if k is not None else named.k
        meth = named.method
        if adaptive is None and make_method(meth).has_head:  # adaptive by default where a head exists
            adaptive_on: Optional[bool] = named.adaptive
        else:
            adaptive_on = adaptive
        if scn.acceptance is not None and make_method(meth).drafts:  # curves are read only with drafts
            from dsim.spec.acceptance import load_acceptance

            load_acceptance(scn.acceptance, meth)
        check_mix_methods(scn.mix, scn.acceptance, [meth])
        check_out_targets(out, step_log)
        w = build_workload(
            scn.trace, scn.format, scn.requests, scn.window, scn.rate, scn.rate_scale, concurrency, scn.mix, seed
        )
        scn_run, notes = resolve_presets(scn, scn_source, "simulate")  # as written to --out: explicit
        prof = scenario_profile(scn_run)
        sc = spec_config(
            meth, k_drafts, adaptive_on, scn.policy, scn.verify_mode, scn.acceptance, scn.head, scn.head_auc
        )
        from dsim.engine.config import EngineConfig

        ec = scenario_engine(scn, record_shapes=step_log is not None) or EngineConfig()
        slo_d = None
        if slo:
            from dsim.study.sla import parse_request_slo

            slo_d = parse_request_slo(slo)
        cfg = SimConfig(
            workload=w,
            profile=prof,
            nodes=nodes,
            gpus_per_node=scn.gpus_per_node,
            router=scn.router,
            engine=ec,
            spec=sc,
            seed=seed,
            slo=slo_d,
        )
        from dsim.study.capacity import method_fit_fields

        fit = method_fit_fields(sc, prof)
        show = not quiet and not as_json and sys.stderr.isatty()
        with contextlib.ExitStack() as stage:  # both outputs, whole, or neither
            out_dir = stage.enter_context(staged_dir(out)) if out is not None else None
            log_file = stage.enter_context(staged_file(step_log, "--step-log")) if step_log is not None else None
            res = run(cfg, progress=show)
            res.summary["setup"]["method_fit"] = fit  # whether the model can run the method, whose acceptance
            if out_dir is not None:
                write_output_files(res, out_dir)
                write_scenario(out_dir, scn_run, "simulate", scn_source, out)
            if log_file is not None:
                write_step_log_file(res, log_file)
        if as_json:
            typer.echo(json.dumps(res.summary, sort_keys=True))
        elif not quiet:
            print_summary(res.summary, ec)
            for line in notes:  # what the preset picked (the measured profile)
                typer.echo(f"note     : {line}")
            from dsim.study.capacity import hypothetical_lines, method_label

            for line in hypothetical_lines({meth: {**fit, "label": method_label(sc)}}, [meth]):
                typer.echo(f"method   : {line}")

    run_guarded(go)


scenario_app = typer.Typer(
    no_args_is_help=True, help="scenario files: every option of simulate, plan, sweep and ab in one YAML file"
)
app.add_typer(scenario_app, name="scenario")


@scenario_app.command("init")
def scenario_init(
    path: Optional[str] = typer.Argument(None, help="file to write (default: print the template)"),
    force: bool = typer.Option(False, "--force", help="overwrite an existing file"),
):
    """Write a commented scenario template: every scenario option at its default, with its help."""

    def go():
        from dsim.outputs import staged_file
        from dsim.scenario import template_yaml

        text = template_yaml()
        if path is None:
            typer.echo(text, nl=False)
            return
        if Path(path).exists() and not force:
            raise InputError(f"{path}: exists (--force overwrites it)")
        with staged_file(path, "PATH") as tmp:
            Path(tmp).write_text(text)
        typer.echo(f"wrote {path}")

    run_guarded(go)


def _one_line(msg: str) -> str:
    return "; ".join(x.strip() for x in str(msg).splitlines() if x.strip())


class _Terminated(BaseException):
    """SIGTERM, raised in the main process so that staged outputs are cleaned up on the way out."""


def _exit_on_sigterm():
    """SIGTERM (``timeout``, a scheduler) unwinds like Ctrl-C: the `with` blocks that stage
    outputs remove them. Worker processes forked later keep the default behaviour."""
    import os

    if threading.current_thread() is not threading.main_thread():
        return None
    pid = os.getpid()

    from dsim.outputs import note_stop

    def handler(sig, frame):
        if os.getpid() != pid:  # a forked worker: die as SIGTERM would have it
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        raise note_stop(_Terminated())

    def on_interrupt(sig, frame):
        if os.getpid() != pid:
            raise KeyboardInterrupt
        raise note_stop(KeyboardInterrupt())

    try:
        old = signal.signal(signal.SIGTERM, handler)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, on_interrupt)  # as Python's own, and recorded
        return old
    except (ValueError, OSError):  # pragma: no cover
        return None


# How long a finished command waits for a kernel compile it started in the background
# (dsim.engine.background_compile) before ending it: the compile fills numba's cache for the next run.
BACKGROUND_COMPILE_WAIT_S = 60.0


def _say_err(text: str) -> None:
    typer.echo(text, err=True)


def main(argv=None):
    """The console entry point. Bad input of any kind (an InputError, a flag click cannot parse,
    a file the OS refuses) is one line on stderr and exit code 2; Ctrl-C is exit code 130."""
    try:  # typer carries its own copy of click; its exceptions are what it raises
        from typer._click import exceptions as cx
    except ImportError:  # pragma: no cover - typer versions built on the click package
        from click import exceptions as cx
    from dsim.cli.toolmain import Terminated
    from dsim.outputs import clear_stop, raise_if_stopped, stopped_by

    clear_stop()
    old_int = signal.getsignal(signal.SIGINT)
    old_term = _exit_on_sigterm()
    completed = False  # the command ran to its end (a background kernel compile may then finish)
    try:
        rc = app(args=argv, standalone_mode=False)
        if rc not in (130, 143):
            raise_if_stopped()  # a stop swallowed in a native callback still ends the run as a stop
        if rc == 130 and isinstance(stopped_by(), Terminated):
            rc = 143  # a SIGTERM unwound as Ctrl-C (the validator's managed server), which typer returns as 130
        completed = rc not in (130, 143)
    except _Terminated:
        typer.echo("dsim: terminated", err=True)
        sys.exit(143)
    except InputError as e:  # raised outside a guarded command body
        typer.echo(f"dsim: error: {_one_line(e)}", err=True)
        sys.exit(2)
    except getattr(cx, "NoArgsIsHelpError", ()) as e:  # `dsim` alone: the help
        typer.echo(e.ctx.get_help() if e.ctx is not None else e.format_message(), err=True)
        sys.exit(2)
    except cx.UsageError as e:
        where = f"{e.ctx.command_path}: " if e.ctx is not None else ""
        typer.echo(f"dsim: error: {where}{_one_line(e.format_message())} (see --help)", err=True)
        sys.exit(2)
    except cx.ClickException as e:
        typer.echo(f"dsim: error: {_one_line(e.format_message())}", err=True)
        sys.exit(e.exit_code)
    except (typer.Abort, KeyboardInterrupt) as e:
        # (standalone_mode=False: a Ctrl-C outside click's own handling arrives as KeyboardInterrupt;
        # a SIGTERM unwound as one, the validator's, is a Terminated)
        rc = 143 if isinstance(e, Terminated) or isinstance(stopped_by(), Terminated) else 130
    except OSError as e:
        if e.errno == errno.EPIPE:  # output piped into a closed reader (head): not an error
            sys.exit(1)
        what = f"{e.filename}: " if e.filename else ""
        typer.echo(f"dsim: error: {what}{e.strerror or e}", err=True)
        sys.exit(2)
    finally:
        from dsim.engine import background_compile

        background_compile.finish(BACKGROUND_COMPILE_WAIT_S if completed else 0.0, say=_say_err)
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
            signal.signal(signal.SIGINT, old_int)
    if rc == 130:  # typer turns a KeyboardInterrupt inside a command into a silent return of 130
        _exit_interrupted(from_console=argv is None)
    if rc == 143:
        typer.echo("dsim: terminated", err=True)
        sys.exit(143)
    if isinstance(rc, int) and rc:
        sys.exit(rc)


def _exit_interrupted(from_console: bool) -> None:
    """Exit code 130 after a Ctrl-C, the staged outputs already removed by the unwinding. From the
    console the process ends with os._exit, skipping interpreter finalization: an interrupted run
    was seen to end there by SIGINT itself (status -2, after this message) whatever exit code it
    was given, with the compiled kernels loaded. In-process callers (tests) get SystemExit(130)."""
    typer.echo("dsim: interrupted", err=True)
    if from_console:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    sys.exit(130)
