"""The product as shipped: the installed wheel runs on its own (profiles, presets and the default
trace inside the package), the module graph has no import cycles and dsim never imports the
validator, and the tree speaks of itself (no history words, no citation of files outside it)."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _module_graph() -> dict[str, set[str]]:
    """module -> the dsim / validator modules it imports (anywhere in the file, lazy imports too)."""
    files = {}
    for pkg in ("dsim", "validator"):
        for p in (ROOT / pkg).rglob("*.py"):
            name = ".".join(p.relative_to(ROOT).with_suffix("").parts)
            files[name.removesuffix(".__init__")] = p
    graph: dict[str, set[str]] = {m: set() for m in files}
    for m, p in files.items():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Import):
                graph[m] |= {a.name for a in node.names if a.name in files}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    if full in files:
                        graph[m].add(full)
                    elif node.module in files:
                        graph[m].add(node.module)
    for m in graph:
        graph[m].discard(m)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles_and_dsim_does_not_import_the_validator():
    graph = _module_graph()
    assert {"dsim.cli.app", "dsim.cli.plan_cli", "dsim.cli.entry", "validator.gpu.profile"} <= set(graph)
    assert _cycles(graph) == []
    upward = sorted(
        (m, d) for m, deps in graph.items() if m.startswith("dsim") for d in deps if d.startswith("validator")
    )
    assert upward == []
    # the graph would show a cycle (the check can fail)
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]


# dsim's stages, lowest first (docs/dev/architecture.md, "Reading guide"): a module imports its own
# layer and those below, never one above (lazy imports counted)
LAYERS = [
    ("dsim.errors", "dsim.outputs", "dsim.schema", "dsim.kernel_cache"),
    ("dsim.workload", "dsim.cost"),
    ("dsim.engine", "dsim.spec"),
    ("dsim.sim",),
    ("dsim.scenario", "dsim.study"),
    ("dsim.profiling",),
    ("dsim.cli", "dsim.__main__"),
]
# the imports up the layers there are, each with its reason
UPWARD_ALLOWED = {
    # a profile without max_model_len takes its model's from the shipped config (MODEL_DIR)
    ("dsim.cost.profile", "dsim.profiling.models"),
    # the builders' exit contract when run as python3 -m (toolmain loads neither typer nor a stage)
    ("dsim.profiling.compose_cli", "dsim.cli.toolmain"),
    ("dsim.profiling.aic_tables", "dsim.cli.toolmain"),
    ("dsim.profiling.deepep_tables", "dsim.cli.toolmain"),
}


def _layer(module: str) -> int | None:
    for i, names in enumerate(LAYERS):
        if any(module == n or module.startswith(n + ".") for n in names):
            return i
    return None


def test_stages_import_only_downward():
    graph = _module_graph()
    assert all(_layer(m) is not None for m in graph if m.startswith("dsim.")), "a dsim module in no layer"
    upward = {
        (m, d)
        for m, deps in graph.items()
        for d in deps
        if m.startswith("dsim.") and d.startswith("dsim.") and _layer(d) > _layer(m)
    }
    assert upward == UPWARD_ALLOWED
    # the check can fail: the engine importing the capacity search would be upward
    assert _layer("dsim.study.capacity") > _layer("dsim.engine.replica")


# history markers (numbered stints, run-diary phrases) and the design brief's file name (written as parts
# so that this file itself holds none of them)
_PARTS = [
    ("sess", r"ions? \d"),
    ("cal", r"ls? \d+\b"),
    ("iss", r"ues? \d+"),
    ("iss", r"ue #\d"),
    ("dev", r"ice cal" + "l"),
    ("des", r"ign\.md"),
    ("wor", r"k period"),
]
HISTORY = re.compile("|".join(rf"\b{a}{b}" for a, b in _PARTS), re.IGNORECASE)


def test_the_tree_speaks_of_itself():
    """No history markers, no run diary, no citation of the design brief (a file outside
    the repository) in code, docs, tests or file names: the tree states its current state."""
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode:
        pytest.skip("not a git checkout")
    hits = []
    for name in listed.stdout.splitlines():
        path = ROOT / name
        if HISTORY.search(name):
            hits.append(f"{name}: file name")
        if path.suffix in (".png", ".parquet", ".jsonl") or "tokenizer" in name or not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        hits += [
            f"{name}:{i}: {line.strip()[:100]}" for i, line in enumerate(text.splitlines(), 1) if HISTORY.search(line)
        ]
    assert hits == []
    diary = " ".join(("see", "device", "call", "12"))  # assembled: this file keeps no such line
    assert HISTORY.search(diary) and not HISTORY.search("session_id, 8 calls per graph")


def _see_running_site_packages(py: Path) -> None:
    """Let the venv of interpreter `py` import the dependencies of the interpreter running the tests.
    `--system-site-packages` shows it the base interpreter's site-packages only: where pytest runs
    inside a virtual environment (dependencies installed there), the new venv would find no typer.
    A .pth file in its site-packages appends the running interpreter's site directories to its
    path, after its own (the wheel's dsim comes first); plain path lines, so the .pth files there
    (an editable dsim's) are not run."""
    r = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    dirs = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()]
    (Path(r.stdout.strip()) / "_running_site_packages.pth").write_text("".join(f"{d}\n" for d in dirs))


@pytest.mark.packaging
def test_wheel_installs_into_a_fresh_venv_and_simulates(tmp_path):
    """A non-editable wheel, installed into a new virtual environment outside the checkout, runs
    `dsim simulate --requests 20` on its packaged default profile and trace, finds a measured
    profile by model name and mounts `dsim validate` through its entry point."""
    src = tmp_path / "src"
    src.mkdir()
    for d in ("dsim", "validator", "profiles", "traces"):
        shutil.copytree(ROOT / d, src / d, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / f, src / f)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DSIM_TRACE_DIR")}
    wheels = tmp_path / "wheels"
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    (wheel,) = wheels.glob("dsim-*.whl")
    import zipfile

    names = set(zipfile.ZipFile(wheel).namelist())
    for need in (
        "dsim/profiles/analytical/deepseek-v4-class-h200x8.yaml",
        "dsim/profiles/h200/h200-qwen3-8b.yaml",
        "dsim/profiles/models/qwen3-8b.json",
        "dsim/presets/deepseek-v4.yaml",
        "dsim/data/default.jsonl",
        "validator/gpu/plan.py",
    ):
        assert need in names, need
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    _see_running_site_packages(py)
    r = subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    run = tmp_path / "elsewhere"  # not the checkout: nothing of it on sys.path
    run.mkdir()
    r = subprocess.run(
        [str(py), "-c", "import dsim, dsim.cost as c; print(dsim.__file__); print(c.PROFILE_DIR)"],
        cwd=run,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    where, profiles = r.stdout.split()
    assert Path(where).is_relative_to(venv) and Path(profiles).is_relative_to(venv)
    dsim = str(venv / "bin" / "dsim")
    r = subprocess.run(
        [dsim, "simulate", "--requests", "20"], cwd=run, capture_output=True, text=True, timeout=300, env=env
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "completed 20/20 requests" in r.stdout and "deepseek-v4-flash-h200-dp8-ep8" in r.stdout
    r = subprocess.run(
        [
            dsim,
            "simulate",
            "--requests",
            "20",
            "--profile",
            "qwen3-8b",
            "--gpus-per-node",
            "1",
            "--method",
            "dspark",
            "--json",
        ],
        cwd=run,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert '"requests_completed": 20' in r.stdout and "h200-qwen3-8b" in r.stdout
    r = subprocess.run([dsim, "validate", "--help"], cwd=run, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0 and "calibrate" in r.stdout, r.stderr[-2000:]


# ---- the kernel cache: numba keys a cached kernel by its own file only -----------------------


def _dsim_imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) of each ``from dsim... import name`` at a module's top level."""
    tree = ast.parse(path.read_text())
    return [
        (node.module, a.name)
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dsim")
        for a in node.names
    ]


def _defining_file(module: str, name: str) -> Path:
    """The file that defines ``name`` as ``module`` exports it, following re-exports (a package's
    ``__init__`` or a module importing the name from another dsim module)."""
    path = ROOT.joinpath(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    for m, n in _dsim_imports(path):
        if n == name:
            return _defining_file(m, n)
    return path.resolve()


def test_every_module_a_cached_kernel_compiles_in_is_in_the_kernel_cache_stamp():
    """KERNEL_SOURCES holds every module with a cached kernel and every dsim module those import a
    name from (a callee kernel or a constant frozen into the machine code), and each module with a
    cached kernel checks the stamp (dsim.kernel_cache.ensure_fresh) before its kernels load."""
    from dsim import kernel_cache

    pkg = ROOT / "dsim"
    listed = {(pkg / rel).resolve() for rel in kernel_cache.KERNEL_SOURCES}
    cached = {f.resolve() for f in pkg.rglob("*.py") if "cache=True" in f.read_text() and f.name != "kernel_cache.py"}
    # (modules that only start or report compiles name the flag in text, without a cached kernel)
    cached = {f for f in cached if re.search(r"@(numba\.)?njit\([^)]*cache=True", f.read_text())}
    assert cached and cached <= listed, sorted(str(f) for f in cached - listed)
    needed = {_defining_file(m, n) for f in cached for m, n in _dsim_imports(f)}
    needed = {f for f in needed if f.name != "kernel_cache.py"}
    assert needed <= listed, sorted(str(f.relative_to(pkg)) for f in needed - listed)
    for f in cached:
        text = f.read_text()
        assert "ensure_fresh()" in text or "compiled_bundles import" in text, f


def test_a_changed_kernel_source_drops_the_cached_kernels_once(tmp_path, monkeypatch):
    from dsim import kernel_cache

    pkg = tmp_path / "pkg"
    (pkg / "engine" / "__pycache__").mkdir(parents=True)
    (pkg / "engine" / "a.py").write_text("x = 1\n")
    (pkg / "engine" / "b.py").write_text("y = 2\n")
    cache = pkg / "engine" / "__pycache__"
    monkeypatch.setattr(kernel_cache, "_PACKAGE", pkg)
    monkeypatch.setattr(kernel_cache, "KERNEL_SOURCES", ("engine/a.py", "engine/b.py"))
    monkeypatch.setattr(kernel_cache, "cache_dirs", lambda src: [src.parent / "__pycache__"])

    def entries(*names):
        for n in names:
            (cache / n).write_text("machine code")

    def fresh():
        monkeypatch.setattr(kernel_cache, "_checked", False)
        kernel_cache.ensure_fresh()
        return sorted(f.name for f in cache.iterdir() if f.name != kernel_cache.STAMP)

    entries("a.k-1.py311.nbi", "a.k-1.py311.1.nbc", "b.j-3.py311.nbi", "other.z-1.py311.nbi", "a.cpython-311.pyc")
    # no stamp yet: what was cached from unknown sources goes, other modules' entries stay
    assert fresh() == ["a.cpython-311.pyc", "other.z-1.py311.nbi"]
    entries("a.k-1.py311.nbi", "b.j-3.py311.nbi")
    assert fresh() == ["a.cpython-311.pyc", "a.k-1.py311.nbi", "b.j-3.py311.nbi", "other.z-1.py311.nbi"]
    # an edit to b alone drops a's entries too (a's kernel may call b's)
    (pkg / "engine" / "b.py").write_text("y = 3\n")
    assert fresh() == ["a.cpython-311.pyc", "other.z-1.py311.nbi"]
    # a cache folder numba has not made yet is made and stamped: what it caches then is current
    shutil.rmtree(cache)
    assert fresh() == []
    entries("a.k-1.py311.nbi")
    assert fresh() == ["a.k-1.py311.nbi"]
    # once a process
    entries("a.k-1.py311.nbi")
    (pkg / "engine" / "a.py").write_text("x = 5\n")
    kernel_cache.ensure_fresh()
    assert (cache / "a.k-1.py311.nbi").exists()
