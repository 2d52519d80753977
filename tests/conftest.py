"""Guards, tiers and fixtures shared by every test module.

The public traces (Azure, Mooncake, BurstGPT) are not part of the repository: dsim reads them from
$DSIM_TRACE_DIR or ../shared/traces (dsim.workload.resolve_trace). A test that reads one says so with
`@pytest.mark.needs_traces("azure-conv", ...)` and is skipped, naming the missing file and where it
was looked for, when that trace is absent (a fresh clone), so the suite stays green without them.

Tiers (docs/dev/testing.md): a test marked with one of TIERS needs more than the code and a few
seconds (a real vLLM server, Ray, a wheel build, torch, the archived measurements, or a long run).
`pytest` alone runs the fast tier, the tests with none of these marks; `pytest --all-tiers` (CI,
the README's command) runs every test; `-m EXPR` selects by marks alone (`-m live`: the live tier);
a test file named on the command line runs whole.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from dsim.errors import InputError
from dsim.workload import resolve_trace
from servers import free_port

# the marks that take a test out of the fast tier (registered, with what each needs, in
# pyproject.toml [tool.pytest.ini_options] markers)
TIERS = ("live", "ray", "packaging", "gpu", "golden", "slow")
# a test that uses one of these fixtures is in that tier whatever its marks say
FIXTURE_TIERS = {"live": "live", "ray_cluster": "ray"}


def pytest_addoption(parser):
    parser.addoption(
        "--all-tiers",
        action="store_true",
        help="run every tier (" + ", ".join(TIERS) + "); without it and without -m, only the fast tier runs",
    )


def pytest_configure(config):
    # the compiled run of general steps compiled where it is first used, not in a background
    # process while its steps run from Python: the tests that compare the two paths compare them
    # (tests/test_compile_notice.py runs the background compile in subprocesses)
    from dsim.engine.background_compile import Deferred

    Deferred.background = False


def missing_traces(names) -> list[str]:
    """The reason each of these public traces cannot be found (dsim's own message), [] if all are."""
    out = []
    for name in names:
        try:
            resolve_trace(name)
        except InputError as e:
            out.append(str(e))
    return out


def pytest_runtest_setup(item):
    for mark in item.iter_markers("needs_traces"):
        if not mark.args:
            raise pytest.UsageError(f"{item.nodeid}: needs_traces() names no trace")
        missing = missing_traces(mark.args)
        if missing:
            pytest.skip("public trace absent: " + "; ".join(missing))


def _named_files(config) -> set[Path]:
    """The test files named on the command line (a FILE or FILE::TEST argument)."""
    out = set()
    for arg in config.args:
        path = (Path(config.invocation_params.dir) / arg.split("::")[0]).resolve()
        if path.is_file():
            out.add(path)
    return out


@pytest.hookimpl(tryfirst=True)  # before -m reads the marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        for fixture, tier in FIXTURE_TIERS.items():
            if fixture in item.fixturenames and not item.get_closest_marker(tier):
                item.add_marker(tier)
    if config.getoption("all_tiers") or config.getoption("markexpr"):
        return
    named = _named_files(config)
    fast, other = [], []
    for item in items:
        tiered = item.path.resolve() not in named and any(item.get_closest_marker(t) for t in TIERS)
        (other if tiered else fast).append(item)
    if other:
        config.hook.pytest_deselected(items=other)
        items[:] = fast
        config.stash[_DESELECTED] = len(other)


_DESELECTED = pytest.StashKey[int]()


def pytest_terminal_summary(terminalreporter, config):
    n = config.stash.get(_DESELECTED, 0)
    if n:
        terminalreporter.write_line(
            f"fast tier: {n} tests of the tiers {', '.join(TIERS)} not run (pytest --all-tiers runs every tier)"
        )


@pytest.fixture
def fake():
    """fake(mode="ok", step_ms=1.0, **validator.fake_server.serve options) -> base URL of a fake
    OpenAI-compatible server in a thread of this process; every one started is shut down after
    the test."""
    from validator import fake_server

    servers = []

    def start(mode="ok", step_ms=1.0, **kw):
        port = free_port()
        httpd = fake_server.serve(port, mode, step_ms, **kw)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        return f"http://127.0.0.1:{port}"

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()
