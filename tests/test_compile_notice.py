"""A first run says that it compiles the kernels, with what and how far; a later run says nothing
(dsim.compile_notice)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# two kernels called from Python: decode_features_ms, which brings the three it calls (one of
# them twice: counted once), and the weighted percentiles' selection
SCRIPT = """
import numpy as np
from dsim import compile_notice
compile_notice.install()
from dsim.cost import decode_features_ms
from dsim.metrics import dist
q, c = np.array([1, 2]), np.array([100, 200])
print(decode_features_ms(q, c, 8, 1, 64, 8, 1.0, 1, 132, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0))
print(dist([1.0, 2.0, 3.0], [1.0, 1.0, 2.0])["p50"])
"""


def _run(args, cache: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), NUMBA_CACHE_DIR=str(cache))
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)


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


def test_the_command_is_silent_on_a_warm_cache(tmp_path):
    """`dsim simulate` announces its compiles where it has any to do (a first run), and says
    nothing once they are cached."""
    cache = tmp_path / "cache"
    first = _run(["-m", "dsim", "simulate", "--requests", "20", "--json"], cache)
    assert first.returncode == 0, first.stderr[-2000:]
    assert first.stderr.startswith("dsim: compiling the simulator's kernels")
    assert first.stderr.splitlines()[-1].startswith("dsim: compiled ")
    again = _run(["-m", "dsim", "simulate", "--requests", "20", "--json"], cache)
    assert again.returncode == 0 and again.stderr == ""
