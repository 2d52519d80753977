"""No background kernel compile outlives the command that started it (dsim.engine.background_compile.finish)."""

import subprocess
import sys
import time

import pytest

from dsim.engine import background_compile as BC


def _child(tmp_path, seconds):
    job, lock = tmp_path / f"job{seconds}", tmp_path / f"lock{seconds}"
    job.write_text("x")
    lock.write_text("1")
    p = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])
    BC._children.append((__import__("os").getpid(), p, str(job), str(lock)))
    return p, job, lock


def test_an_interrupted_command_ends_its_background_compiles_at_once(tmp_path):
    p, job, lock = _child(tmp_path, 30)
    said = []
    t0 = time.monotonic()
    BC.finish(0.0, say=said.append)
    assert time.monotonic() - t0 < 5
    assert p.poll() is not None and not job.exists() and not lock.exists()
    assert said == [] and not BC._children


@pytest.mark.slow
def test_a_finished_command_waits_for_a_compile_that_ends_in_time_and_ends_one_that_does_not(tmp_path):
    quick, qjob, _ = _child(tmp_path, 0.5)
    slow, sjob, slock = _child(tmp_path, 30)
    said = []
    t0 = time.monotonic()
    BC.finish(2.0, say=said.append)
    waited = time.monotonic() - t0
    assert 1.5 <= waited < 10
    assert quick.returncode == 0 and qjob.exists()  # (a compile that finished removes its own files)
    assert slow.poll() is not None and not sjob.exists() and not slock.exists()
    assert len(said) == 1 and "at most 2 s" in said[0]
    assert not BC._children
