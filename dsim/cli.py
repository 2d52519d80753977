"""The `dsim` command line (typer).

Every command turns bad input (InputError) into one line on stderr and exit code 2.
"""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from dsim.errors import InputError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None,
                  help="dsim: size LLM serving fleets that run speculative decoding (MTP, EAGLE-3, "
                       "block drafters, DSpark).")


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
TraceOpt = Annotated[str, typer.Option(help="trace path or name (default, azure-conv, azure-code, "
                                       "mooncake-conversation, mooncake-synthetic, ...)")]
FormatOpt = Annotated[str, typer.Option("--format", help="auto, azure, mooncake, burstgpt, native-csv, "
                                        "native-jsonl, native-parquet")]
RequestsOpt = Annotated[Optional[int], typer.Option(help="first N requests")]
WindowOpt = Annotated[Optional[str], typer.Option(help="time window START:END (s)")]
RateOpt = Annotated[Optional[float], typer.Option(help="re-draw Poisson arrivals at R req/s")]
RateScaleOpt = Annotated[Optional[float], typer.Option(help="scale the trace's arrival rate (0.1-100)")]
MixOpt = Annotated[Optional[str], typer.Option(help="workload-class mix, e.g. math=0.3,code=0.2,chat=0.5")]
ProfileOpt = Annotated[Optional[str], typer.Option(help="profile name or YAML path "
                                                   "(default: deepseek-v4-class-h200x8)")]
GpusPerNodeOpt = Annotated[int, typer.Option(help="GPUs per node")]

def build_workload(trace: str = "default", fmt: str = "auto", requests: Optional[int] = None,
                   window: Optional[str] = None, rate: Optional[float] = None,
                   rate_scale: Optional[float] = None, concurrency: Optional[int] = None,
                   mix: Optional[str] = None, seed: int = 0):
    """The workload a command runs: a trace (or 'default'), sliced and re-timed as asked."""
    from dsim import workload as W
    if requests is not None and requests < 1:
        raise InputError(f"--requests: must be >= 1, got {requests}")
    if rate is not None and rate <= 0:
        raise InputError(f"--rate: must be > 0, got {rate}")
    if concurrency is not None and concurrency < 1:
        raise InputError(f"--concurrency: must be >= 1, got {concurrency}")
    win = None
    if window:
        try:
            a, b = (float(x) for x in window.split(":"))
        except ValueError:
            raise InputError(f"--window: expected START:END in seconds, got {window!r}") from None
        win = (a, b)
    w = W.load_workload(trace, fmt, mix=mix, seed=seed, n=requests, window=win, rate_scale=rate_scale)
    if rate is not None:
        import numpy as np
        rng = np.random.default_rng([seed, 7])
        gaps = rng.exponential(1.0 / rate, len(w.arrival_s))
        gaps[0] = 0.0
        w = dataclasses.replace(w, arrival_s=np.cumsum(gaps),
                                source=w.source + f"; arrivals re-drawn Poisson at {rate:g} req/s (seed {seed})")
    if concurrency is not None:
        import numpy as np
        w = dataclasses.replace(w, closed_loop_concurrency=int(concurrency), arrival_s=np.zeros(len(w.arrival_s)),
                                source=w.source + f"; closed loop, {concurrency} users")
    return w


def spec_config(method: str, k: Optional[int], adaptive: Optional[bool], policy: str,
                verify_mode: str, acceptance: Optional[str], head: str, head_auc: float):
    from dsim.sim import SpecConfig
    if adaptive is None:
        adaptive = method == "dspark"
    return SpecConfig(method=method, k=k, adaptive=adaptive, policy=policy, verify_mode=verify_mode,
                      acceptance=acceptance, head=head, head_auc=head_auc)


def method_spec(token: str, **common):
    """Parse a method token of --methods: none, mtp, mtp3, eagle3, block, dspark, dspark-fixed."""
    from dsim.sim import SpecConfig
    t = token.strip().lower()
    k = None
    adaptive = False
    if t.startswith("mtp") and t[3:].isdigit():
        t, k = "mtp", int(t[3:])
    if t in ("dspark", "dspark-adaptive"):
        t, adaptive = "dspark", True
    elif t == "dspark-fixed":
        t = "dspark"
    if t not in ("none", "mtp", "eagle3", "block", "dspark"):
        raise InputError(f"--methods: unknown method {token!r} (none, mtp, mtpK, eagle3, block, dspark, dspark-fixed)")
    return SpecConfig(method=t, k=k, adaptive=adaptive, **common)


def print_summary(s: dict):
    typer.echo(f"workload : {s['setup']['workload']}")
    typer.echo(f"profile  : {s['setup']['profile']}")
    if s["setup"].get("acceptance_source"):
        src = s['setup']['acceptance_source']
        typer.echo(f"acceptance: {src if len(src) < 200 else src[:197] + '...'}")
    if s["setup"]["class_mix_assumed"]:
        typer.echo("classes  : workload-class mix is an assumption (the trace carries no classes)")
    typer.echo(f"cluster  : {s['setup']['nodes']} node(s), {s['setup']['replicas']} replica(s), "
               f"{s['setup']['gpus']} GPUs; method {s['setup']['spec']['method']} k={s['setup']['spec']['k']}")
    typer.echo(f"completed {s['requests_completed']}/{s['requests_total']} requests in {s['sim_time_s']:.1f} s "
               f"simulated ({s['wall_time_s']:.2f} s wall, {s['steps']} steps)")
    typer.echo(f"output   : {s['output_tok_s']:.1f} tok/s, {s['output_tok_s_per_gpu']:.1f} tok/s/GPU, "
               f"{s['output_tok_s_per_user'] or 0:.1f} tok/s per user")
    typer.echo(f"{'metric':8} {'mean':>10} {'p50':>10} {'p90':>10} {'p99':>10}  (ms)")
    for m in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        d = s[m]
        typer.echo(f"{m[:-3]:8} " + " ".join(f"{(d[k] if d[k] is not None else float('nan')):10.2f}"
                                           for k in ("mean", "p50", "p90", "p99")))
    if s.get("per_position_acceptance"):
        typer.echo(f"acceptance length {s['acceptance_length']:.3f}; per position "
                   + " ".join(f"{x:.3f}" for x in s["per_position_acceptance"])
                   + f"; verify tokens/request/step {s['mean_verify_tokens_per_request']:.2f}")
        if s.get("verify_utilization") is not None:
            typer.echo(f"verify utilization {s['verify_utilization']:.3f} (drafts accepted within the chosen "
                       f"windows / accepted had the full block been verified; DSpark reports 0.88-0.97)")
        for c, v in s.get("per_class", {}).items():
            typer.echo(f"  {c:6} acceptance length {v['acceptance_length']:.3f}, "
                       f"verify tokens {v['mean_verify_tokens_per_request']:.2f}")
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
    method: str = typer.Option("none", help="none, mtp, eagle3, block, dspark"),
    k: Optional[int] = typer.Option(None, "--k", help="drafts per step (default: mtp 1, others 7)"),
    adaptive: Optional[bool] = typer.Option(None, "--adaptive/--no-adaptive", help="dspark: confidence-scheduled verification (default on)"),
    policy: str = typer.Option("vllm", help="verify-budget policy: vllm, paper, paper-production, sglang, fixed, threshold"),
    verify_mode: str = typer.Option("compact", help="static, compact, cap-accept"),
    acceptance: Optional[str] = typer.Option(None, help="acceptance preset, file, 'math=0.9,0.8;chat=0.7' or const:P"),
    head: str = typer.Option("model", help="confidence head: model, perfect, useless"),
    head_auc: float = typer.Option(0.85, help="target ROC-AUC of the confidence head"),
    max_num_seqs: int = typer.Option(1024),
    max_num_batched_tokens: int = typer.Option(8192),
    prefix_caching: bool = typer.Option(False, "--prefix-caching/--no-prefix-caching"),
    async_scheduling: bool = typer.Option(False, "--async-scheduling/--no-async-scheduling"),
    slo: Optional[str] = typer.Option(None, help="per-request SLOs for goodput, e.g. ttft=500ms,tpot=20ms"),
    seed: int = typer.Option(0),
    out: Optional[Path] = typer.Option(None, help="write summary.json, requests.parquet, steps.parquet here"),
    step_log: Optional[Path] = typer.Option(None, help="write a step-shape log (JSONL) for GPU replay"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as one JSON object"),
    quiet: bool = typer.Option(False, "--quiet"),
):
    """Replay a trace through a modeled vLLM-style engine and report what a real server would show."""
    def go():
        from dsim.cost import load_profile
        from dsim.engine import EngineConfig
        from dsim.sim import SimConfig, simulate as run, write_outputs, write_step_log
        w = build_workload(trace, format, requests, window, rate, rate_scale, concurrency, mix, seed)
        prof = load_profile(profile)
        sc = spec_config(method, k, adaptive, policy, verify_mode, acceptance, head, head_auc)
        ec = EngineConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                          enable_prefix_caching=prefix_caching, async_scheduling=async_scheduling,
                          record_shapes=step_log is not None)
        slo_d = None
        if slo:
            from dsim.plan import parse_request_slo
            slo_d = parse_request_slo(slo)
        cfg = SimConfig(workload=w, profile=prof, nodes=nodes, gpus_per_node=gpus_per_node, router=router,
                        engine=ec, spec=sc, seed=seed, slo=slo_d)
        show = not quiet and not as_json and sys.stderr.isatty()
        res = run(cfg, progress=show)
        if out is not None:
            write_outputs(res, out)
        if step_log is not None:
            write_step_log(res, step_log)
        if as_json:
            typer.echo(json.dumps(res.summary, sort_keys=True))
        elif not quiet:
            print_summary(res.summary)
    run_guarded(go)


def _mount_subcommands():
    try:
        from dsim import plan_cli  # noqa: F401  (registers plan, sweep, ab on `app`)
    except ImportError:
        pass
    try:
        from validator.cli import app as validate_app
        app.add_typer(validate_app, name="validate", help="Drive a real vLLM server / GPU: measure, calibrate, compare.")
    except ImportError:
        pass


_mount_subcommands()


def main():
    try:
        app(standalone_mode=True)
    except InputError as e:   # raised outside a guarded command body
        typer.echo(f"dsim: error: {e}", err=True)
        sys.exit(2)
