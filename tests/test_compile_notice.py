"""A first run says that it compiles the kernels, with what and how far; a later run says nothing
(dsim.engine.compile_notice)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# two kernels called from Python: decode_features_ms, which brings the three it calls (one of
# them twice: counted once), and the weighted percentiles' selection
SCRIPT = """
import numpy as np
from dsim.engine import compile_notice
compile_notice.install()
from dsim.cost.attention import decode_features_ms
from dsim.engine.metrics import dist
q, c = np.array([1, 2]), np.array([100, 200])
print(decode_features_ms(q, c, (8, 1, 64, 8, 1.0, 1, 132), (1.0, 1.0, 1.0, 1.0, 1.0, 0.0)))
print(dist([1.0, 2.0, 3.0], [1.0, 1.0, 2.0])["p50"])
"""


def _run(args, cache: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), NUMBA_CACHE_DIR=str(cache))
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)


@pytest.mark.slow
def test_cold_cache_announces_each_compile_and_a_warm_one_is_silent(tmp_path):
    cold = _run(["-c", SCRIPT], tmp_path)
    assert cold.returncode == 0, cold.stderr
    lines = cold.stderr.splitlines()
    assert lines[0].startswith("dsim: compiling the simulator's kernels") and str(tmp_path) in lines[0]
    assert lines[1].startswith("dsim:   kernels 1-4 of 4 so far: decode_features_ms and 3 it calls (")
    assert lines[2].startswith("dsim:   kernel 5 of 5 so far: _select_weighted (")
    assert lines[3].startswith("dsim: compiled 5 kernels in ") and len(lines) == 4
    warm = _run(["-c", SCRIPT], tmp_path)
    assert warm.returncode == 0 and warm.stderr == "" and warm.stdout == cold.stdout


@pytest.mark.slow
def test_the_command_announces_a_cold_run_compiles_in_the_background_and_is_silent_warm(tmp_path):
    """`dsim simulate` on an empty cache announces its compiles, and the compiled run of general
    steps (a closed loop on one replica takes it) compiling in a background process while those
    steps run from Python; once that process has written the cache, the same command says
    nothing and prints the same result."""
    cache = tmp_path / "cache"
    args = ["-m", "dsim", "simulate", "--profile", "deepseek-v4-class-h200x8", "--concurrency", "64",
            "--requests", "128", "--method", "mtp", "--json"]  # fmt: skip
    first = _run(args, cache)
    assert first.returncode == 0, first.stderr[-2000:]
    lines = first.stderr.splitlines()
    assert lines[0].startswith("dsim: compiling the simulator's kernels") and lines[-1].startswith("dsim: compiled ")
    assert "dsim:   run_general_steps: compiling in a background process (meanwhile its steps run in Python)" in lines
    deadline = time.monotonic() + 600
    while list(cache.rglob("*.compiling")) and time.monotonic() < deadline:
        time.sleep(1)
    assert list(cache.rglob("compiled_general_steps.run_general_steps-*.nbc")), (
        "the background compile wrote no cache entry"
    )
    again = _run(args, cache)
    assert again.returncode == 0 and again.stderr == ""
    a, b = (json.loads(r.stdout) for r in (first, again))
    a.pop("wall_time_s"), b.pop("wall_time_s")
    assert a == b
