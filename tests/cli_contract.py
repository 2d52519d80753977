"""The error contract, checked in-process: ``run_cli(*args)`` runs dsim's console entry point
(dsim.cli.entry.main) with captured output; ``assert_rejected`` asserts exit code 2, exactly one line on
stderr (naming the given needles, no traceback, no numpy repr) and nothing new in a directory."""

from __future__ import annotations

import io
import os
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path


def run_cli(*args) -> tuple[int, str, str]:
    from dsim.cli.entry import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            main([str(a) for a in args])
            rc = 0
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return rc, out.getvalue(), err.getvalue()


def tree(d) -> set:
    """Every path under d (hidden ones too: staging debris starts with a dot)."""
    d = Path(d)
    return {str(p.relative_to(d)) for p in d.rglob("*")} if d.exists() else set()


def assert_one_line(err: str, needles=()) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1, err
    line = lines[0]
    assert "Traceback" not in err and "np.int" not in line and "np.float" not in line, line
    for n in needles:
        assert n in line, (n, line)
    return line


def assert_rejected(*args, needles=(), watch=None) -> str:
    """The command fails cleanly: exit 2, one line naming ``needles``, ``watch`` unchanged."""
    before = tree(watch) if watch is not None else None
    rc, out, err = run_cli(*args)
    assert rc == 2, (rc, out[-500:], err[-2000:])
    line = assert_one_line(err, needles)
    if watch is not None:
        assert tree(watch) == before, sorted(tree(watch) ^ before)
    return line


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0
