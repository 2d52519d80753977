"""The `dsim` command as a whole: the core commands (dsim.cli.app), the planning commands
(dsim.cli.plan_cli) and the command groups that other packages plug in.

A package plugs in by declaring an entry point in the `dsim.commands` group whose target is a
function taking dsim's typer app (validator declares `validate = "validator.cli:mount"`); dsim
itself never imports those packages by name. Installed distributions are read through their
metadata; a source checkout (dsim imported from a tree that holds its pyproject.toml, e.g. with
PYTHONPATH pointing at it) also reads the declarations of that pyproject, so it behaves as it
would installed.
"""

from __future__ import annotations

import importlib
from importlib.metadata import distributions
from pathlib import Path

import typer

from dsim.cli import (
    plan_cli,  # noqa: F401  (registers plan, sweep and ab on dsim.cli.app.app)
    profile_cli,  # noqa: F401  (registers the profile group on dsim.cli.app.app)
)
from dsim.cli.app import app
from dsim.cli.app import main as _run
from dsim.engine import compile_notice

PLUGIN_GROUP = "dsim.commands"
_mounted: set[str] = set()


def _checkout_plugins() -> dict[str, str]:
    """The `dsim.commands` entry points declared by the pyproject.toml next to this dsim package."""
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    if not pyproject.is_file():
        return {}
    try:
        import tomllib
    except ImportError:  # Python 3.10: installed metadata only
        return {}
    try:
        project = tomllib.loads(pyproject.read_text()).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        return {}
    if project.get("name") != "dsim":
        return {}
    return dict(project.get("entry-points", {}).get(PLUGIN_GROUP, {}))


def plugins() -> dict[str, str]:
    """name -> 'module:function' of every command group plugged into dsim (a source checkout's
    own declarations first, then every installed distribution's)."""
    found = _checkout_plugins()
    for dist in distributions():
        for ep in dist.entry_points:
            if ep.group == PLUGIN_GROUP:
                found.setdefault(ep.name, ep.value)
    return found


def mount_plugins(root: typer.Typer = app) -> list[str]:
    """Mount every plugged-in command group on `root` (once each); one whose package cannot be
    imported (an optional part not installed) is left out. Returns the names mounted."""
    for name, target in sorted(plugins().items()):
        if name in _mounted:
            continue
        module, _, func = target.partition(":")
        try:
            mount = getattr(importlib.import_module(module.strip()), func.strip())
        except (ImportError, AttributeError):
            continue
        mount(root)
        _mounted.add(name)
    return sorted(_mounted)


mount_plugins(app)


def main(argv: list[str] | None = None) -> None:
    """The `dsim` console script and `python -m dsim`. As a process's command (no argv given), a
    first run's kernel compiles are announced on stderr (dsim.engine.compile_notice); a caller that
    passes argv (in-process use, tests) keeps its stderr as it was."""
    if argv is None:
        compile_notice.install()
    _run(argv)
