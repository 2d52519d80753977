"""A measured profile's files (torch-free): the profile dict and its YAML, where a shipped profile's raw
sweep lives (profiles/ and archive/), commands recorded relative to the repository, atomic writes.
"""

from __future__ import annotations

import json
from pathlib import Path

from validator.gpu.fit import forward_table


def profile_dict(
    *,
    name: str,
    provenance: dict,
    kv_cache_gib: float,
    kv_bytes_per_token: float,
    caps: list[int],
    fit: dict,
    draft: dict,
    cpu_overhead_ms: float = 1.5,
    extra: dict | None = None,
) -> dict:
    d = {
        "name": name,
        "provenance": provenance,
        "memory": {"kv_cache_gib": round(float(kv_cache_gib), 2), "kv_bytes_per_token": float(kv_bytes_per_token)},
        "cpu_overhead_ms": float(cpu_overhead_ms),
        "capture_sizes": [int(c) for c in caps],
        "forward": forward_table(fit, caps),
        "kv_ms_per_ktok": round(float(fit["kv_ms_per_ktok"]), 6),
    }
    if fit.get("prefill_terms"):
        d["prefill_terms"] = dict(fit["prefill_terms"])
    if fit.get("attention"):
        d["format_version"] = 2
        d["attention"] = dict(fit["attention"])
    if draft:
        d["draft"] = {
            k: {"requests": [int(r) for r in v["requests"]], "ms": [round(float(m), 5) for m in v["ms"]]}
            for k, v in draft.items()
        }
    d["fit"] = {"residual_pct": fit["residual_pct"]}
    if extra:
        d.update(extra)
    return d


def dump_yaml(d: dict) -> str:
    """YAML text (JSON is valid YAML, used where pyyaml is missing)."""
    d = json.loads(json.dumps(d, default=lambda o: o.item() if hasattr(o, "item") else str(o)))
    try:
        import yaml

        return yaml.safe_dump(d, sort_keys=False, width=120)
    except ImportError:  # pragma: no cover
        return json.dumps(d, indent=1)


REPO_ROOT = Path(__file__).resolve().parents[2]
# What the package reads at run time (profiles/<gpu>/<gpu>-<model>.yaml) apart from the measurements
# behind it (archive/<gpu>/: the .raw.json sweep, context/, replay/, steplogs*/; archive/MANIFEST.md).
PROFILES_DIR = REPO_ROOT / "profiles"
ARCHIVE_DIR = REPO_ROOT / "archive"


def raw_of(yaml_path: Path) -> Path:
    """A measured profile's raw sweep: <name>.raw.json next to the YAML (a profile being made, a
    copy), else, for a shipped profile profiles/<gpu>/<name>.yaml, archive/<gpu>/<name>.raw.json."""
    yaml_path = Path(yaml_path)
    beside = yaml_path.with_name(yaml_path.name.replace(".yaml", ".raw.json"))
    if beside.exists() or yaml_path.resolve().parent.parent != PROFILES_DIR:
        return beside
    return ARCHIVE_DIR / yaml_path.resolve().parent.name / beside.name


def yaml_of(raw_path: Path) -> Path:
    """The profile a raw sweep was fitted into: <name>.yaml next to RAW, else, for a raw file of the
    archive (archive/<gpu>/<name>.raw.json), the shipped profiles/<gpu>/<name>.yaml."""
    raw_path = Path(raw_path)
    beside = raw_path.with_name(raw_path.name.replace(".raw.json", ".yaml"))
    if beside.exists() or raw_path.resolve().parent.parent != ARCHIVE_DIR:
        return beside
    return PROFILES_DIR / raw_path.resolve().parent.name / beside.name


def repo_relative(command: str) -> str:
    """A command as a profile's provenance records it: paths inside the repository written
    relative to its root (the command runs from there), so no machine's checkout path is kept."""
    return command.replace(f"cd {REPO_ROOT} && ", "").replace(f"{REPO_ROOT}/", "")


def write_text_atomic(path: str | Path, text: str) -> None:
    """Whole or not at all, never over anything but a regular file (dsim.outputs)."""
    from dsim.outputs import write_file

    write_file(path, text, "output", parents=True)
