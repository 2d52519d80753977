"""Executors (dsim.study.executor) and the progress bar (dsim.study.progress).

- the Ray executor gives the local executor's results: plan table and JSON, sweep.csv, the A/B
  report's plan.json and sweep.csv (a local Ray of 2 CPUs started by each test, shut down after);
- the workload and profile go into the object store once, however many tasks use them; a task's
  InputError reaches the caller as itself;
- without ray, `--executor ray` is one line and exit 2 (the import failure simulated); an address
  nobody answers at is one line and exit 2; Ctrl-C cancels the tasks, stops Ray, writes nothing;
- the progress bar: nothing on stderr when it is not a terminal; on a terminal it counts every
  simulation (local and Ray), and its total never falls below what the search ends up running.
"""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from builders import AB_ARGS, SWEEP_ARGS
from dsim.cli.entry import app
from dsim.errors import InputError
from dsim.study.capacity import _Search
from dsim.study.sla import parse_sla
from servers import free_port

ROOT = Path(__file__).resolve().parent.parent

PLAN_ARGS = [
    "plan",
    "--sla",
    "p50=18ms",
    "--requests",
    "120",
    "--rate-scale",
    "4",
    "--seeds",
    "0,1",
    "--max-nodes",
    "8",
    "--jobs",
    "2",
]


@pytest.fixture
def ray_cluster():
    """A local Ray of 2 CPUs for one test, shut down after it."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def invoke(args):
    return CliRunner().invoke(app, args)


def csv_without_wall_time(path: Path) -> list[list[str]]:
    """sweep.csv's cells as written, less the wall_time_s column (the one measured, not simulated)."""
    rows = list(csv.reader(path.read_text().splitlines()))
    i = rows[0].index("wall_time_s")
    return [r[:i] + r[i + 1 :] for r in rows]


# ---- the same results on Ray ------------------------------------------------------------------


def test_plan_ray_matches_local(ray_cluster):
    for extra in ([], ["--json"]):
        loc = invoke(PLAN_ARGS + extra)
        ray_ = invoke(PLAN_ARGS + extra + ["--executor", "ray"])
        assert loc.exit_code == ray_.exit_code == 0, (loc.output, ray_.output)
        assert loc.stdout == ray_.stdout
        assert loc.stderr == ray_.stderr == ""
    d = json.loads(ray_.stdout)
    assert d["mtp"]["nodes"] >= 1 and d["dspark"]["search"]


def test_sweep_ray_matches_local(ray_cluster, tmp_path):
    loc = invoke(SWEEP_ARGS + ["--out", str(tmp_path / "local")])
    ray_ = invoke(SWEEP_ARGS + ["--out", str(tmp_path / "ray"), "--executor", "ray"])
    assert loc.exit_code == ray_.exit_code == 0, (loc.output, ray_.output)
    a, b = csv_without_wall_time(tmp_path / "local/sweep.csv"), csv_without_wall_time(tmp_path / "ray/sweep.csv")
    assert len(a) == 5 and a == b
    # the printed table and the figures' source rows match too (the "wrote ..." line names the directory)
    assert loc.stdout.splitlines()[:-1] == ray_.stdout.splitlines()[:-1]


def test_ab_ray_matches_local(ray_cluster, tmp_path):
    loc = invoke(AB_ARGS + ["--out", str(tmp_path / "local")])
    ray_ = invoke(AB_ARGS + ["--out", str(tmp_path / "ray"), "--executor", "ray"])
    assert loc.exit_code == ray_.exit_code == 0, (loc.output, ray_.output)
    assert (tmp_path / "local/plan.json").read_bytes() == (tmp_path / "ray/plan.json").read_bytes()
    assert csv_without_wall_time(tmp_path / "local/sweep.csv") == csv_without_wall_time(tmp_path / "ray/sweep.csv")
    # the report differs only in the command it quotes
    md_l = (tmp_path / "local/report.md").read_text().replace(str(tmp_path / "local"), "OUT")
    md_r = (tmp_path / "ray/report.md").read_text().replace(str(tmp_path / "ray"), "OUT")
    assert md_l == md_r.replace(" --executor ray", "")


@pytest.mark.ray
def test_sweep_on_the_local_ray_it_starts_matches_local(tmp_path):
    """Without a Ray in the process or RAY_ADDRESS, --executor ray starts a local Ray for the
    run (and shuts it down): the same sweep.csv and printed table as the local executor."""
    pytest.importorskip("ray")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("RAY_ADDRESS", None)
    outs = {}
    for name, extra in (("local", []), ("ray", ["--executor", "ray"])):
        r = subprocess.run(
            [sys.executable, "-m", "dsim", *SWEEP_ARGS, "--out", str(tmp_path / name), *extra],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert r.returncode == 0, r.stderr[-2000:]
        assert "Traceback" not in r.stderr
        outs[name] = r.stdout
    a, b = csv_without_wall_time(tmp_path / "local/sweep.csv"), csv_without_wall_time(tmp_path / "ray/sweep.csv")
    assert len(a) == 5 and a == b
    assert outs["local"].splitlines()[:-1] == outs["ray"].splitlines()[:-1]


def test_plan_joins_the_cluster_named_by_ray_address(ray_cluster):
    """A second process joins the test's cluster through RAY_ADDRESS and gets the local result."""
    addr = ray_cluster.get_runtime_context().gcs_address
    env = dict(os.environ, PYTHONPATH=str(ROOT), RAY_ADDRESS=addr, RAY_AUTH_MODE="token")
    p = subprocess.run(
        [sys.executable, "-m", "dsim"] + PLAN_ARGS + ["--executor", "ray"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    assert p.stderr == b""
    assert p.stdout.decode() == invoke(PLAN_ARGS).stdout


def test_joined_cluster_runs_the_drivers_dsim(ray_cluster, tmp_path):
    """Joining ships the driver's dsim package to the cluster: its workers import that copy."""
    addr = ray_cluster.get_runtime_context().gcs_address
    script = (
        "import dsim.study.executor as E\n"
        "def where():\n"
        "    import dsim\n"
        "    return dsim.__file__\n"
        f"ex = E.RayExecutor(2, {addr!r})\n"
        "print(ex.submit(where).result())\n"
        "ex.close()\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), RAY_AUTH_MODE="token")
    env.pop("RAY_ADDRESS", None)
    p = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, timeout=300)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    where = p.stdout.decode().strip()
    assert where.endswith("dsim/__init__.py") and not where.startswith(str(ROOT)), where


def test_ray_ships_workload_and_profile_once(ray_cluster):
    from dsim.cost import load_profile
    from dsim.scenario import build_workload, method_spec
    from dsim.study.capacity import Point, run_point
    from dsim.study.executor import RayExecutor

    w, prof = build_workload("default", requests=20), load_profile(None)
    specs = [method_spec("mtp"), method_spec("dspark")]
    ex = RayExecutor(jobs=2)
    puts = []
    real_put = ex.ray.put
    ex.ray = type("R", (), {})()  # a stand-in module counting the puts
    ex.ray.put = lambda obj: puts.append(type(obj).__name__) or real_put(obj)
    futs = [ex.submit(run_point, Point(w, prof, sp, n, 0)) for sp in specs for n in (1, 2, 3)]
    got = [f.result() for f in futs]
    ex.ray = ray_cluster
    ex.close()
    assert ray_cluster.is_initialized()  # a Ray the caller started is left running
    # six tasks, one put per distinct object: the workload, the profile, each method's spec
    assert sorted(puts) == sorted(["Workload", "Profile", "SpecConfig", "SpecConfig"])
    local = [run_point(Point(w, prof, sp, n, 0)) for sp in specs for n in (1, 2, 3)]
    strip = [{k: v for k, v in r["summary"].items() if k != "wall_time_s"} for r in got]
    assert strip == [{k: v for k, v in r["summary"].items() if k != "wall_time_s"} for r in local]


def test_ray_task_error_is_the_tasks_own(ray_cluster):
    from dsim.study.executor import RayExecutor

    ex = RayExecutor(jobs=2)
    f = ex.submit(parse_sla, "p50=20")
    with pytest.raises(InputError, match="no unit") as e:
        f.result()
    assert "\n" not in str(e.value)
    ex.close()


# ---- failures: one line, exit 2 ----------------------------------------------------------------


@pytest.mark.parametrize("cmd", [PLAN_ARGS, SWEEP_ARGS + ["--out", "/nonexistent/never"], AB_ARGS + ["--out", "/x"]])
def test_executor_ray_without_ray_is_one_line(monkeypatch, cmd):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    res = invoke(cmd + ["--executor", "ray"])
    assert res.exit_code == 2, res.output
    assert res.stdout == ""
    assert res.stderr.splitlines() == ["dsim: error: --executor ray: ray is not installed (pip install -e '.[ray]')"]


def test_executor_flags_checked(monkeypatch):
    for extra, msg in (
        (["--executor", "dask"], "--executor: must be local or ray"),
        (["--ray-address", "10.0.0.1:6379"], "--ray-address: only with --executor ray"),
    ):
        res = invoke(PLAN_ARGS + extra)
        assert res.exit_code == 2 and len(res.stderr.splitlines()) == 1 and msg in res.stderr, res.output


@pytest.mark.ray
def test_unreachable_cluster_is_one_line(monkeypatch):
    pytest.importorskip("ray")
    port = free_port()
    for env, extra in ((None, ["--ray-address", f"127.0.0.1:{port}"]), (f"127.0.0.1:{port}", [])):
        if env:
            monkeypatch.setenv("RAY_ADDRESS", env)
        res = invoke(PLAN_ARGS + ["--executor", "ray"] + extra)
        assert res.exit_code == 2, res.output
        assert res.stdout == ""
        (line,) = res.stderr.splitlines()
        assert line.startswith(f"dsim: error: --ray-address: no Ray cluster reachable at 127.0.0.1:{port}")
    res = invoke(PLAN_ARGS + ["--executor", "ray", "--ray-address", "nohostport"])
    assert res.exit_code == 2 and "is not HOST:PORT" in res.stderr


@pytest.mark.ray
def test_ctrl_c_cancels_ray_and_writes_nothing(tmp_path):
    pytest.importorskip("ray")
    out = tmp_path / "sw"
    # a sweep of minutes at 2 CPUs; interrupted once its tasks run
    cmd = [
        sys.executable,
        "-m",
        "dsim",
        "sweep",
        "--concurrency",
        "256,128",
        "--methods",
        "dspark,mtp",
        "--requests-per-user",
        "40",
        "--jobs",
        "2",
        "--executor",
        "ray",
        "--out",
        str(out),
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("RAY_ADDRESS", None)
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not _running_tasks(p.pid):
            time.sleep(0.5)
        assert _running_tasks(p.pid), "no Ray task started"
        time.sleep(2)
        ray_pids = _ray_workers_of(p.pid)
        os.killpg(p.pid, signal.SIGINT)  # what Ctrl-C sends: the whole foreground group
        stdout, stderr = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode != 0
    assert stdout == b""
    assert not out.exists() or not any(out.iterdir())
    assert b"Traceback" not in stderr, stderr.decode()[-2000:]
    # Ray's workers and raylet exit after the driver; on a loaded 2-core machine that has taken
    # over 30 s (a worker force-cancelled mid-task notices its raylet's exit on its next poll)
    deadline = time.time() + 90
    while time.time() < deadline and any(_alive(q) for q in ray_pids):
        time.sleep(0.5)
    assert not [q for q in ray_pids if _alive(q)], "Ray processes outlived the run by 90 s"


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _running_tasks(pid: int) -> list[int]:
    """Ray workers of the run that are executing a task (a worker names itself after its task)."""
    out = []
    for q in _ray_workers_of(pid):
        try:
            if (Path("/proc") / str(q) / "cmdline").read_bytes().startswith(b"ray::_ray_call"):
                out.append(q)
        except OSError:
            pass
    return out


def _ray_workers_of(pid: int) -> list[int]:
    """Processes descended from pid (Ray's raylet, GCS and workers once ray.init has run)."""
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    alive = []
    for c in out:
        try:
            cmdline = (Path("/proc") / str(c) / "cmdline").read_bytes()
        except OSError:
            continue
        if b"ray" in cmdline:
            alive.append(c)
    return alive


# ---- the progress bar ---------------------------------------------------------------------------


@pytest.mark.slow
def test_no_progress_output_when_stderr_is_not_a_terminal(tmp_path):
    for args in (PLAN_ARGS, SWEEP_ARGS + ["--out", str(tmp_path / "sw")], AB_ARGS + ["--out", str(tmp_path / "ab")]):
        res = invoke(args)
        assert res.exit_code == 0, res.output
        assert res.stderr == ""


class _Recorder:
    """Every (done, total) the bar shows."""

    def __init__(self, monkeypatch):
        from dsim.study import progress

        self.seen: list[tuple[int, int]] = []
        real = progress.Progress._redraw
        rec = self

        def redraw(self):
            rec.seen.append((self.done_n, self.total))
            real(self)

        monkeypatch.setattr(progress.Progress, "_redraw", redraw)
        monkeypatch.setattr(progress, "is_terminal", lambda stream: True)


def _check_bar(seen, stderr, desc):
    done, total = seen[-1]
    assert done == total > 0
    assert all(t >= done for _d, t in seen)  # the total never fell below the final count
    assert all(d <= t for d, t in seen)
    assert f"{desc}: {done}/{total} sims" in stderr


@pytest.mark.slow
def test_progress_bar_on_a_terminal(monkeypatch, tmp_path):
    rec = _Recorder(monkeypatch)
    res = invoke(PLAN_ARGS)
    assert res.exit_code == 0, res.output
    _check_bar(rec.seen, res.stderr, "plan")
    assert "mtp trying 1 node(s)" in res.stderr and "dspark" in res.stderr
    plain = invoke(PLAN_ARGS)
    assert plain.stdout == res.stdout  # the bar changes nothing else
    rec.seen.clear()
    res = invoke(SWEEP_ARGS + ["--out", str(tmp_path / "sw")])
    assert res.exit_code == 0, res.output
    _check_bar(rec.seen, res.stderr, "sweep")
    assert rec.seen[-1][1] == 4
    rec.seen.clear()
    res = invoke(AB_ARGS + ["--out", str(tmp_path / "ab")])
    assert res.exit_code == 0, res.output
    _check_bar(rec.seen, res.stderr, "ab")


def test_progress_bar_with_ray(monkeypatch, ray_cluster, tmp_path):
    rec = _Recorder(monkeypatch)
    res = invoke(SWEEP_ARGS + ["--out", str(tmp_path / "sw"), "--executor", "ray"])
    assert res.exit_code == 0, res.output
    _check_bar(rec.seen, res.stderr, "sweep")
    rec.seen.clear()
    res = invoke(PLAN_ARGS + ["--executor", "ray"])
    assert res.exit_code == 0, res.output
    _check_bar(rec.seen, res.stderr, "plan")


def test_progress_writes_nothing_off_a_terminal():
    from dsim.study.progress import Progress

    s = io.StringIO()
    with Progress("plan", stream=s) as bar:
        bar.ahead(search=5)
        bar.submitted(3)
        bar.finished(3)
        bar.note("mtp trying 2 node(s)")
    assert s.getvalue() == ""


# ---- the search's bound on what it may still run (the bar's total) ------------------------------


def _result(passes: bool) -> dict:
    return {"complete": True, "metrics": {"tpot_p50": 5.0 if passes else 50.0}}


@settings(max_examples=150, deadline=None)
@given(
    max_nodes=st.integers(1, 70),
    start=st.integers(1, 70),
    n_seeds=st.integers(1, 3),
    needs=st.lists(st.integers(1, 80), min_size=3, max_size=3),
)
def test_search_remaining_bounds_what_it_runs(max_nodes, start, n_seeds, needs):
    """Seed s passes at n nodes iff n >= needs[s]; at every point the search's remaining() is at
    least the number of simulations it goes on to run."""
    slos = parse_sla("p50=10ms")
    seeds = list(range(n_seeds))
    srch = _Search("m", seeds, slos, 0.0, max_nodes, start)
    bounds, ran = [], 0
    while True:
        bounds.append((ran, srch.remaining()))
        want = srch.want()
        if not want:
            break
        n, s = want[0]  # one at a time: the tightest order for the bound
        srch.feed(n, s, _result(n >= needs[s]))
        ran += 1
    assert all(ran - before <= bound for before, bound in bounds)
    assert srch.remaining() == 0
    out = srch.outcome()
    need = max(needs[:n_seeds])
    assert out["met"] == (need <= max_nodes) and (not out["met"] or out["nodes"] == need)
