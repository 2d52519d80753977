"""Guards and settings shared by every test module.

The public traces (Azure, Mooncake, BurstGPT) are not part of the repository: dsim reads them from
$DSIM_TRACE_DIR or ../shared/traces (dsim.workload.resolve_trace). A test that reads one says so with
`@pytest.mark.needs_traces("azure-conv", ...)` and is skipped, naming the missing file and where it
was looked for, when that trace is absent (a fresh clone), so the suite stays green without them.
"""

from __future__ import annotations

import threading

import pytest

from dsim.errors import InputError
from dsim.workload import resolve_trace
from servers import free_port


def pytest_configure(config):
    # the compiled run of general steps compiled where it is first used, not in a background
    # process while its steps run from Python: the tests that compare the two paths compare them
    # (tests/test_compile_notice.py runs the background compile in subprocesses)
    from dsim.engine.background_compile import Deferred

    Deferred.background = False
    config.addinivalue_line(
        "markers",
        "needs_traces(*names): reads these public traces (dsim.workload.TRACE_FILES names); "
        "skipped where they are absent",
    )


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
