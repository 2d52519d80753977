"""Keep numba's on-disk kernel cache true to the source.

Numba keys a cached kernel by its own source file (path, modification time, size) only. dsim's
kernels call and inline kernels of other modules and freeze other modules' constants (the slot
table's columns, the policy and head codes, the KV block size) into their machine code, so an edit
to a callee's module alone (a ``git pull``, a branch switch) would leave its callers' cached
machine code in use, silently computing with the old callee. ``ensure_fresh`` closes that gap: one
hash over every module in KERNEL_SOURCES (those holding cached kernels and those whose code or
constants they compile in); where it differs from the stamp beside a cache folder's entries, that
folder's entries of these modules are dropped once and each kernel compiles again on first use.

Precondition: KERNEL_SOURCES names every such module (tests/test_packaging.py checks it against
the tree: each module with a cached kernel, and each dsim module those import from). Postcondition:
no cache entry of a KERNEL_SOURCES module survives a change to any of them. Best effort: a cache
folder it cannot write is left alone (numba then caches in its user-wide folder, handled alike)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

# relative to the dsim package
KERNEL_SOURCES = (
    "cost/attention.py",
    "cost/profile.py",  # KV_BLOCK_TOKENS
    "engine/compiled_bundles.py",
    "engine/compiled_budget.py",
    "engine/compiled_decode.py",
    "engine/compiled_draws.py",
    "engine/compiled_general_steps.py",
    "engine/compiled_sched.py",
    "engine/compiled_window.py",
    "engine/metrics.py",
    "spec/head_fit.py",
    "spec/heads.py",  # HEAD_CODES
)
STAMP = "dsim-kernel-sources.stamp"
_PACKAGE = Path(__file__).resolve().parent
_checked = False


def sources_hash() -> str:
    h = hashlib.sha256()
    for rel in KERNEL_SOURCES:
        h.update(rel.encode())
        h.update((_PACKAGE / rel).read_bytes())
    return h.hexdigest()


def cache_dirs(source: Path) -> list[Path]:
    """Where numba may keep a module's cache entries, in the order numba tries them: under
    NUMBA_CACHE_DIR when set, beside the module (``__pycache__``) where that is writable, numba's
    user-wide folder (numba's own naming of the subfolders). The first is where it writes."""
    beside = source.parent / "__pycache__"
    try:
        from numba.core import caching, config
        from numba.misc.appdirs import AppDirs

        sub = caching._CacheLocator.get_suitable_cache_subpath(str(source))
        user_dir = getattr(config, "CACHE_DIR", "")  # (NUMBA_CACHE_DIR)
        wide = Path(AppDirs(appname="numba", appauthor=False).user_cache_dir) / sub
    except Exception:  # (numba's internals moved: the folder beside the source still counts)
        return [beside]
    if user_dir:
        return [Path(user_dir) / sub, beside, wide]
    return [beside, wide] if os.access(source.parent, os.W_OK) else [wide, beside]


def ensure_fresh() -> None:
    """Drop dsim's cached kernels where they were compiled from other sources (once a process),
    and stamp the folder numba will write to, so that what it caches now counts as current."""
    global _checked
    if _checked:
        return
    _checked = True
    digest = sources_hash()
    by_dir: dict[Path, list[str]] = {}
    active: set[Path] = set()
    for rel in KERNEL_SOURCES:
        src = _PACKAGE / rel
        dirs = cache_dirs(src)
        active.add(dirs[0])
        for d in dirs:
            by_dir.setdefault(d, []).append(src.stem)
    for d, stems in by_dir.items():
        stamp = d / STAMP
        try:
            if not d.is_dir():
                if d not in active:
                    continue
                d.mkdir(parents=True, exist_ok=True)
            elif stamp.is_file() and stamp.read_text() == digest:
                continue
            else:
                for f in d.iterdir():
                    if f.suffix in (".nbi", ".nbc") and f.name.split(".", 1)[0] in stems:
                        f.unlink(missing_ok=True)
            tmp = d / f"{STAMP}.{os.getpid()}"
            tmp.write_text(digest)
            os.replace(tmp, stamp)
        except OSError:
            continue
