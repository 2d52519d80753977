"""The `dsim` command line (typer): the app, the options the workload-driven commands share, and
`dsim simulate`. The planning commands (dsim.plan_cli) and plugged-in command groups (dsim.entry)
register themselves on `app`; this module imports neither.

Every command turns bad input (InputError) into one line on stderr and exit code 2.
"""

from __future__ import annotations

import contextlib
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
from dsim.scenario import build_workload, disaggregation, disaggregation_note, spec_config

if TYPE_CHECKING:
    from dsim.engine import EngineConfig

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


def fail(msg: str):
    typer.echo(f"dsim: error: {msg}", err=True)
    raise typer.Exit(2)


def run_guarded(fn, *a, **kw):
    try:
        return fn(*a, **kw)
    except InputError as e:
        fail(str(e))


# ---- shared option plumbing (used by simulate, plan, sweep, ab) ------------------------------

# Options every workload-driven command takes, declared once.
TraceOpt = Annotated[
    str,
    typer.Option(
        help="trace path or name (default, azure-conv, azure-code, mooncake-conversation, mooncake-synthetic, ...)"
    ),
]
FormatOpt = Annotated[
    str, typer.Option("--format", help="auto, azure, mooncake, burstgpt, native-csv, native-jsonl, native-parquet")
]
RequestsOpt = Annotated[Optional[int], typer.Option(help="first N requests")]
WindowOpt = Annotated[Optional[str], typer.Option(help="time window START:END (s)")]
RateOpt = Annotated[Optional[float], typer.Option(help="re-draw Poisson arrivals at R req/s")]
RateScaleOpt = Annotated[Optional[float], typer.Option(help="scale the trace's arrival rate (0.1-100)")]
MixOpt = Annotated[Optional[str], typer.Option(help="workload-class mix, e.g. math=0.3,code=0.2,chat=0.5")]
ProfileOpt = Annotated[
    Optional[str], typer.Option(help="profile name or YAML path (default: deepseek-v4-flash-h200-dp8-ep8)")
]
GpusPerNodeOpt = Annotated[int, typer.Option(help="GPUs per node")]
# Prefill/decode disaggregation (dsim.engine.EngineConfig.kv_role)
DisaggregatedOpt = Annotated[
    bool,
    typer.Option(
        "--disaggregated",
        help="simulate decode instances of a prefill/decode-disaggregated deployment (vLLM kv_role "
        "kv_consumer): prompts' KV arrives computed, only decode runs on these GPUs",
    ),
]
RemotePrefillMsOpt = Annotated[
    float,
    typer.Option(help="--disaggregated: assumed delay per request on the prefill instance and the KV transfer (ms)"),
]
RemotePrefillPerKtokOpt = Annotated[
    float, typer.Option(help="--disaggregated: assumed further delay per 1000 prompt tokens (ms)")
]

POLICY_NAMES = ("vllm", "paper", "paper-production", "sglang", "fixed", "threshold")


def check_mix(mix: Optional[str], acceptance: Optional[str] = None, method: Optional[str] = None) -> None:
    """--mix names classes the acceptance curves know: math, code, chat, or those of the
    --acceptance given."""
    if mix is None:
        return
    from dsim.workload import DEFAULT_CLASSES, parse_mix

    shares = parse_mix(mix)
    known = set(DEFAULT_CLASSES)
    if acceptance:
        from dsim.spec import load_acceptance

        known |= set(load_acceptance(acceptance, method).classes)
    unknown = [c for c in shares if c not in known]
    if unknown:
        raise InputError(f"--mix: unknown class {unknown[0]!r} (known: {', '.join(sorted(known))})")


def check_int(value, what: str, lo: int, hi: Optional[int] = None) -> None:
    if value is None:
        return
    if value < lo or (hi is not None and value > hi):
        rng = f">= {lo}" if hi is None else f"in {lo}..{hi}"
        raise InputError(f"{what}: must be {rng}, got {value}")


def check_out_targets(out: Optional[Path], step_log: Optional[Path] = None) -> None:
    """Fail before a run when its outputs could not be written."""
    from dsim.outputs import check_dir_target, check_file_target

    if out is not None:
        check_dir_target(out, "--out")
    if step_log is not None:
        check_file_target(step_log, "--step-log")


def print_summary(s: dict, engine: EngineConfig) -> None:
    """The human-readable summary of one simulation run with this engine configuration."""
    from dsim.diagnostics import format_warnings
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
def simulate(
    trace: TraceOpt = "default",
    format: FormatOpt = "auto",
    profile: ProfileOpt = None,
    nodes: int = typer.Option(1, help="nodes"),
    gpus_per_node: GpusPerNodeOpt = 8,
    router: str = typer.Option("least_outstanding", help="round_robin, least_outstanding, affinity"),
    concurrency: Optional[int] = typer.Option(None, help="closed loop: C users"),
    rate: RateOpt = None,
    rate_scale: RateScaleOpt = None,
    requests: RequestsOpt = None,
    window: WindowOpt = None,
    mix: MixOpt = None,
    method: str = typer.Option(
        "none", help="none, mtp, eagle3, block, dspark; or a token of plan's --methods (mtp3, dspark5, dspark5-fixed)"
    ),
    k: Optional[int] = typer.Option(None, "--k", help="drafts per step (default: mtp 1, others 7)"),
    adaptive: Optional[bool] = typer.Option(
        None, "--adaptive/--no-adaptive", help="dspark: confidence-scheduled verification (default on)"
    ),
    policy: str = typer.Option(
        "vllm", help="verify-budget policy: vllm, paper, paper-production, sglang, fixed, threshold"
    ),
    verify_mode: str = typer.Option("compact", help="static, compact, cap-accept"),
    acceptance: Optional[str] = typer.Option(None, help="acceptance preset, file, 'math=0.9,0.8;chat=0.7' or const:P"),
    head: str = typer.Option("model", help="confidence head: model, perfect, useless"),
    head_auc: float = typer.Option(0.85, help="target ROC-AUC of the confidence head"),
    max_num_seqs: int = typer.Option(1024),
    max_num_batched_tokens: int = typer.Option(8192),
    max_model_len: Optional[int] = typer.Option(
        None, help="longest prompt + output a request may have (default: the profile's max_model_len, else none)"
    ),
    prefix_caching: bool = typer.Option(False, "--prefix-caching/--no-prefix-caching"),
    async_scheduling: bool = typer.Option(False, "--async-scheduling/--no-async-scheduling"),
    disaggregated: DisaggregatedOpt = False,
    remote_prefill_ms: RemotePrefillMsOpt = 0.0,
    remote_prefill_ms_per_ktok: RemotePrefillPerKtokOpt = 0.0,
    slo: Optional[str] = typer.Option(None, help="per-request SLOs for goodput, e.g. ttft=500ms,tpot=20ms"),
    seed: int = typer.Option(0),
    out: Optional[str] = typer.Option(None, help="write summary.json, requests.parquet, steps.parquet here"),
    step_log: Optional[str] = typer.Option(None, help="write a step-shape log (JSONL) for GPU replay"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as one JSON object"),
    quiet: bool = typer.Option(False, "--quiet"),
):
    """Replay a trace through a modeled vLLM-style engine and report what a real server would show."""

    def go():
        from dsim.cost import load_profile
        from dsim.engine import EngineConfig
        from dsim.outputs import staged_dir, staged_file
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
        check_int(gpus_per_node, "--gpus-per-node", 1, MAX_GPUS_PER_NODE)
        check_int(seed, "--seed", 0)
        check_int(max_model_len, "--max-model-len", 1)
        if policy.strip().lower() not in POLICY_NAMES:
            raise InputError(f"--policy: unknown policy {policy!r} (choose from {', '.join(POLICY_NAMES)})")
        from dsim.scenario import method_spec
        from dsim.spec import make_method

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
        drafts = meth != "none"  # acceptance curves are read only with drafts
        if acceptance is not None:
            from dsim.spec import load_acceptance

            if not acceptance.strip():
                raise InputError("--acceptance: empty (a preset name, a file, const:P or class=p1,p2,...)")
            if drafts:
                load_acceptance(acceptance, meth)
        check_mix(mix, acceptance if drafts else None, meth)
        check_out_targets(out, step_log)
        w = build_workload(trace, format, requests, window, rate, rate_scale, concurrency, mix, seed)
        prof = load_profile(profile)
        if max_model_len is not None:
            prof = dataclasses.replace(prof, max_model_len=max_model_len)
        sc = spec_config(meth, k_drafts, adaptive_on, policy, verify_mode, acceptance, head, head_auc)
        ec = EngineConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            enable_prefix_caching=prefix_caching,
            async_scheduling=async_scheduling,
            record_shapes=step_log is not None,
            **disaggregation(disaggregated, remote_prefill_ms, remote_prefill_ms_per_ktok),
        )
        slo_d = None
        if slo:
            from dsim.plan import parse_request_slo

            slo_d = parse_request_slo(slo)
        cfg = SimConfig(
            workload=w,
            profile=prof,
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            router=router,
            engine=ec,
            spec=sc,
            seed=seed,
            slo=slo_d,
        )
        show = not quiet and not as_json and sys.stderr.isatty()
        with contextlib.ExitStack() as stage:  # both outputs, whole, or neither
            out_dir = stage.enter_context(staged_dir(out)) if out is not None else None
            log_file = stage.enter_context(staged_file(step_log, "--step-log")) if step_log is not None else None
            res = run(cfg, progress=show)
            if out_dir is not None:
                write_output_files(res, out_dir)
            if log_file is not None:
                write_step_log_file(res, log_file)
        if as_json:
            typer.echo(json.dumps(res.summary, sort_keys=True))
        elif not quiet:
            print_summary(res.summary, ec)

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


def main(argv=None):
    """The console entry point. Bad input of any kind (an InputError, a flag click cannot parse,
    a file the OS refuses) is one line on stderr and exit code 2; Ctrl-C is exit code 130."""
    try:  # typer carries its own copy of click; its exceptions are what it raises
        from typer._click import exceptions as cx
    except ImportError:  # pragma: no cover - typer versions built on the click package
        from click import exceptions as cx
    from dsim.outputs import clear_stop, raise_if_stopped

    clear_stop()
    old_int = signal.getsignal(signal.SIGINT)
    old_term = _exit_on_sigterm()
    try:
        rc = app(args=argv, standalone_mode=False)
        if rc != 130:
            raise_if_stopped()  # a stop swallowed in a native callback still ends the run as a stop
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
    except (typer.Abort, KeyboardInterrupt):
        # (standalone_mode=False: a Ctrl-C outside click's own handling arrives as KeyboardInterrupt)
        rc = 130
    except OSError as e:
        if e.errno == errno.EPIPE:  # output piped into a closed reader (head): not an error
            sys.exit(1)
        what = f"{e.filename}: " if e.filename else ""
        typer.echo(f"dsim: error: {what}{e.strerror or e}", err=True)
        sys.exit(2)
    finally:
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
            signal.signal(signal.SIGINT, old_int)
    if rc == 130:  # typer turns a KeyboardInterrupt inside a command into a silent return of 130
        _exit_interrupted(from_console=argv is None)
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
