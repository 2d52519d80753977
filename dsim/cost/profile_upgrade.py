"""Upgrading a profile mapping of an older format to the current one, the only place that knows
the older formats (``load_profile`` upgrades every file on read, then parses the current format
alone; ``dsim profile upgrade``, dsim.cost.profile.upgrade_profile_file, writes the upgrade back).

``upgrade_profile(raw)`` is pure: a parsed profile document in, the current format's mapping out,
the input untouched. What it converts (docs/dev/profile-format.md, "Versions"):

- formats 1 to 4 gated which sections a file may carry: ``attention`` needs 2,
  ``request_attention`` 3, its ``step_indexer`` and ``step_keys`` 4, its ``block_pool`` 5. A file
  with a section its ``format_version`` (default 1) does not allow is inconsistent: refused with
  the section's path, as the loader always did. Each format only added optional sections, so a
  consistent older file is a current file without the later ones: its fields carry over unchanged;
- ``format_version`` becomes the current one (written where ``profile_to_dict`` writes it when
  the file had none).

``prefill_terms`` form 1 (no ``version``: discount, pair attention and per-chunk terms) is not
converted to form 2 (``version: 2``): it has no exact equivalent there. The cost model prices a
form-1 chunk as q (a (c + q / 2) - d) + e, a chunk of no tokens included, form 2 as
q (a c + a q / 2 - d) + e over non-empty chunks: the same terms, other roundings, so results
would move. Form 1 stays a form of the current format, as the measured and analytical profiles
write it.

A current file comes back as it is (``upgrade_profile`` is idempotent). Anything that is not a
profile mapping, or a field of the wrong type, is passed through for the loader to report.
"""

from __future__ import annotations

from typing import Any

from dsim import __version__
from dsim import schema as S
from dsim.errors import InputError
from dsim.schema import Doc

FORMAT_VERSION = 5  # the current format; files of 1 to FORMAT_VERSION - 1 are upgraded on read

# (section path, the oldest format that may carry it)
SECTION_VERSIONS = (
    (("attention",), 2),
    (("request_attention",), 3),
    (("request_attention", "step_indexer"), 4),
    (("request_attention", "step_keys"), 4),
    (("request_attention", "block_pool"), 5),
)
# the keys profile_to_dict writes before format_version: a file without one gets it after the last present
_BEFORE_FORMAT_VERSION = (
    "name",
    "provenance",
    "memory",
    "cpu_overhead_ms",
    "capture_sizes",
    "forward",
    "kv_ms_per_ktok",
    "max_model_len",
    "prefill_terms",
)


def source_format_version(raw: Any, doc: Doc | None = None) -> int:
    """The format a parsed profile says it is in (``format_version``, default 1). InputError
    (path, line, field) for a value that is not a known version."""
    doc = doc if doc is not None else S.Doc("<profile>")
    if not isinstance(raw, dict) or raw.get("format_version") is None:
        return 1
    v = raw["format_version"]
    S.integer(v, doc, "format_version", lo=1)
    if int(v) > FORMAT_VERSION:
        raise InputError(
            f"{doc.at('format_version')}: {int(v)} is newer than this dsim reads (formats 1 to {FORMAT_VERSION})"
        )
    return int(v)


def _section(raw: dict, path: tuple) -> Any:
    cur: Any = raw
    for key in path:
        if not isinstance(cur, dict):
            return None
        cur = cur.get(key)
    return cur


def _check_sections(raw: dict, version: int, doc: Doc) -> None:
    """An older file's sections against what its format allowed (module doc)."""
    for path, needs in SECTION_VERSIONS:
        if version < needs and _section(raw, path) is not None:
            raise InputError(f"{doc.at(*path)}: needs format_version: {needs}")


def _with_format_version(raw: dict) -> dict:
    """raw with format_version the current one, in place where it was, else where
    profile_to_dict writes it."""
    if "format_version" in raw:
        return {k: (FORMAT_VERSION if k == "format_version" else v) for k, v in raw.items()}
    keys = list(raw)
    at = max((keys.index(k) + 1 for k in _BEFORE_FORMAT_VERSION if k in raw), default=len(keys))
    out = {k: raw[k] for k in keys[:at]}
    out["format_version"] = FORMAT_VERSION
    out.update({k: raw[k] for k in keys[at:]})
    return out


def upgrade_profile(raw: Any, doc: Doc | None = None) -> Any:
    """The current format's mapping of a parsed profile of any supported format (module doc).
    ``doc`` (dsim.schema.Doc): where errors point (file and line); InputError for an inconsistent
    older file or an unknown format_version. Not a mapping: returned as it is."""
    if not isinstance(raw, dict):
        return raw
    doc = doc if doc is not None else S.Doc("<profile>")
    version = source_format_version(raw, doc)
    if version == FORMAT_VERSION:
        return raw
    _check_sections(raw, version, doc)
    return _with_format_version(raw)


def upgrade_note(from_version: int, date: str) -> dict:
    """The provenance entry ``dsim profile upgrade`` appends to ``provenance.format_upgrades``."""
    return {
        "from_format_version": int(from_version),
        "to_format_version": FORMAT_VERSION,
        "by": f"dsim {__version__} (dsim profile upgrade)",
        "date": date,
    }
