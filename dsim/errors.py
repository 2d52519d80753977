"""One exception type for bad user input.

The CLI turns an InputError into a single line on stderr and exit code 2 (no traceback).
Messages name what and where: ``path:line: field: problem``.
"""

from __future__ import annotations

from typing import Any


class InputError(Exception):
    """Bad input from the user: a malformed trace, profile, SLA string or flag."""


def where(path: object, line: int | None = None, field: str | None = None) -> str:
    """Format a location prefix ``path:line: field:`` for an InputError message."""
    out = str(path)
    if line is not None:
        out += f":{line}"
    if field is not None:
        out += f": {field}"
    return out


def plain(v: Any) -> str:
    """A value as a user wrote it, for messages: numbers without numpy's repr (np.int64(-5) ->
    -5), strings quoted with unprintable characters escaped, long text cut."""
    if hasattr(v, "item") and callable(v.item) and getattr(v, "ndim", 1) == 0:
        v = v.item()
    if isinstance(v, bool) or v is None:
        return str(v).lower() if isinstance(v, bool) else "null"
    if isinstance(v, float):
        return f"{v:g}" if v == v and abs(v) != float("inf") else str(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, (bytes, bytearray)):
        v = bytes(v).decode("utf-8", "replace")
    if isinstance(v, str):
        return shown(v)
    return shown(str(v), quote=False)


def shown(text: str, limit: int = 60, quote: bool = True) -> str:
    """``text`` quoted, control and non-ASCII-printable characters escaped, cut at ``limit``."""
    out = []
    for ch in text[:limit]:
        if ch.isprintable() and ch != "\ufffd":
            out.append(ch)
        else:
            out.append(ascii(ch)[1:-1])
    s = "".join(out) + ("..." if len(text) > limit else "")
    return f"'{s}'" if quote else s
