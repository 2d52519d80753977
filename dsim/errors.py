"""One exception type for bad user input.

The CLI turns an InputError into a single line on stderr and exit code 2 (no traceback).
Messages name what and where: ``path:line: field: problem``.
"""


class InputError(Exception):
    """Bad input from the user: a malformed trace, profile, SLA string or flag."""


def where(path, line=None, field=None) -> str:
    """Format a location prefix ``path:line: field:`` for an InputError message."""
    out = str(path)
    if line is not None:
        out += f":{line}"
    if field is not None:
        out += f": {field}"
    return out
