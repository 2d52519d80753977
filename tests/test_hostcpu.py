"""Other work on a local server's engine CPUs (validator.hostcpu): the server's processes found
from its listening port, the interference arithmetic in closed form, a real busy process on the
engine's CPU measured as such, and the run's record and flag."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from validator import hostcpu, noise

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="needs Linux /proc")


def _snap(t, cpus, procs, listener=1, me=(0.0, frozenset({1}))):
    return {"t": t, "cpus": cpus, "procs": procs, "listener": listener, "self": me}


def test_interference_in_closed_form():
    """CPU 0 holds the engine (pids 2 and 3, pinned there), CPU 1 the API server (pid 1): over
    2 s, CPU 0 was busy 1.8 s, 1.2 s of it the engine's: 0.6 s of other work, a third of its
    busy time. The API server's time on CPU 1 does not count; the measuring client, where it
    shares CPU 0, is named as part of the other work."""
    hz = hostcpu._ticks()
    on0, on1 = frozenset({0}), frozenset({1})
    a = _snap(0.0, {0: (0.0, 0.0), 1: (0.0, 0.0)}, {1: (0.0, on1), 2: (0.0, on0), 3: (0.0, on0)})
    b = _snap(
        2.0,
        {0: (1.8 * hz, 0.2 * hz), 1: (1.0 * hz, 1.0 * hz)},
        {1: (1.0 * hz, on1), 2: (0.9 * hz, on0), 3: (0.3 * hz, on0)},
    )
    it = hostcpu.interference(a, b)
    assert it["engine_cpus"] == [0] and it["wall_s"] == 2.0
    assert (it["busy_s"], it["server_s"], it["others_s"], it["idle_s"]) == pytest.approx((1.8, 1.2, 0.6, 0.2))
    assert it["others_share"] == pytest.approx(1 / 3, abs=1e-4) and it["client_s"] == 0.0
    # the API server's CPU 1: busy 1.0 s, 1.0 s of it the API server's own: nothing else there
    assert it["front"]["cpus"] == [1] and it["front"]["others_share"] == 0.0
    # the client on the engine's CPU, 0.25 s of CPU over the run: part of the other work
    a["self"], b["self"] = (0.0, on0), (0.25, on0)
    assert hostcpu.interference(a, b)["client_s"] == pytest.approx(0.25)
    # the client on the API server's CPU (0.3 s) and 0.4 s of other work there (busy 1.7 s):
    # the client is no interference, the other 0.4 s are
    a["self"], b["self"] = (0.0, on1), (0.3, on1)
    b["cpus"][1] = (1.7 * hz, 0.3 * hz)
    front = hostcpu.interference(a, b)["front"]
    assert front["client_s"] == pytest.approx(0.3) and front["others_share"] == pytest.approx(0.4 / 1.7, abs=1e-4)
    m = type("M", (), {"path": "run.jsonl", "summary": {"interference": hostcpu.interference(a, b)}})()
    flags = [f.split(": ", 1)[1] for f in noise.interference_flags([m])]
    assert len(flags) == 2 and flags[0].startswith("other work took 33% of the server's engine CPUs [0]")
    assert flags[1].startswith("other work (besides the measuring client) took 24% of the API server's CPUs [1]")
    # a process that left during the run is not counted; no engine CPUs, no result
    assert hostcpu.interference(a, dict(b, procs={})) is None
    assert hostcpu.interference(None, b) is None


def test_a_remote_or_absent_server_has_no_processes():
    assert hostcpu.server_pids("http://example.invalid:8000") is None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # (bound, not listening)
    assert hostcpu.server_pids(f"http://127.0.0.1:{port}") is None
    assert hostcpu.snapshot(None) is None


SERVER = textwrap.dedent(
    """
    import os, socket, subprocess, sys, time
    s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
    # the engine: a child pinned to CPU 0, asleep (as an idle engine is)
    child = subprocess.Popen([sys.executable, "-c", "import os, time; os.sched_setaffinity(0, {0}); time.sleep(60)"])
    print(s.getsockname()[1], child.pid, flush=True)
    time.sleep(60)
    """
)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity")
def test_a_busy_process_on_the_engines_cpu_is_other_work():
    """A listener with a child pinned to CPU 0 (a server and its engine): found from the port,
    and a busy loop pinned to CPU 0 over a second shows as other work taking most of that CPU."""
    proc = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    hog = None
    try:
        port, child = (int(x) for x in proc.stdout.readline().split())
        time.sleep(0.3)  # (the child pins itself)
        pids = hostcpu.server_pids(f"http://127.0.0.1:{port}/v1")
        assert pids == {"listener": proc.pid, "descendants": [child]}
        hog = subprocess.Popen(
            [sys.executable, "-c", "import os; os.sched_setaffinity(0, {0})\nwhile True: pass"],
        )
        time.sleep(0.3)
        a = hostcpu.snapshot(pids)
        time.sleep(1.0)
        it = hostcpu.interference(a, hostcpu.snapshot(pids))
        assert it["engine_cpus"] == [0]
        assert it["others_share"] > 0.8 and it["others_s"] > 0.7, it
        flags = noise.interference_flags([type("M", (), {"path": "run.jsonl", "summary": {"interference": it}})()])
        assert flags[0].startswith("run.jsonl: other work took")
    finally:
        for p in (hog, proc):
            if p is not None:
                p.kill()
                p.wait()


def test_a_quiet_run_is_not_flagged():
    it = {"engine_cpus": [0], "busy_s": 1.0, "others_s": 0.02, "others_share": 0.02, "client_s": 0.0}
    m = type("M", (), {"path": "run.jsonl", "summary": {"interference": it}})()
    assert noise.interference_flags([m]) == [] and noise.interference_flags([type("M", (), {"summary": {}})()]) == []
