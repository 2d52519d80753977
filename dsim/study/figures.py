"""What every figure dsim draws shares: one colour and marker per method, titles that say what
was simulated, SLA lines, readable log axes, and the PNG writer.

``method_style(name) -> (colour, marker)``: one map for every figure (sweep, ab report, paper
comparison), keyed by the method's name (``mtp``, ``mtp3``, ``dspark``, ``dspark5-fixed``, ...);
a name outside the map gets a colour derived from the name itself, so it too keeps one colour
everywhere. ``context_line(profile, workload, methods)`` -> "model on hardware, topology;
trace ...; methods", the second line of every title. ``readable_log_axis(ax, "x")``: major ticks at
1-2-5 per decade (or the data's own values), plain numbers, no minor labels.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dsim.workload import Workload

#: method -> (colour, marker); the single map every figure reads
METHOD_STYLE = {
    "none": ("#7f7f7f", "o"),
    "mtp": ("#1f77b4", "s"),
    "eagle3": ("#9467bd", "^"),
    "block": ("#ff7f0e", "v"),
    "dspark": ("#d62728", "D"),
    "dspark-fixed": ("#e377c2", "P"),
}
_SPARE = ("#2ca02c", "#8c564b", "#17becf", "#bcbd22", "#393b79", "#637939")
#: the second line of a pair whose two methods share a colour (two lengths of one method); in
#: neither map above, so it is never some other method's colour
_PAIR_ALT = "#1b9e77"
#: methods whose names carry a draft length ('mtp3', 'block8', 'dspark5'); other digits are part
#: of the name ('eagle3')
_LENGTHED = re.compile(r"(mtp|block|dspark)\d+")


def method_key(name: str) -> str:
    """The style key of a method name: the name itself when the map has it, else without a draft
    length ('mtp3' -> 'mtp') and with '-adaptive' dropped ('dspark5-adaptive' -> 'dspark',
    'dspark5-fixed' -> 'dspark-fixed'); 'eagle3' stays 'eagle3'."""
    n = str(name).lower()
    if n in METHOD_STYLE:
        return n
    fixed = n.endswith("-fixed")
    base = n.removesuffix("-fixed").removesuffix("-adaptive")
    m = _LENGTHED.fullmatch(base)
    if m:
        base = m.group(1)
    return f"{base}-fixed" if fixed else base


def method_style(name: str) -> tuple[str, str]:
    """(colour, marker) of a method, the same in every figure."""
    key = method_key(name)
    if key in METHOD_STYLE:
        return METHOD_STYLE[key]
    h = int(hashlib.sha256(key.encode()).hexdigest(), 16)  # (stable across runs, unlike hash())
    return _SPARE[h % len(_SPARE)], "o"


def pair_colours(name_a: str, name_b: str) -> tuple[str, str]:
    """The two colours of an A/B figure, each the method's own; when both methods share one
    (two lengths of one method) B gets a colour no method has."""
    ca, cb = method_style(name_a)[0], method_style(name_b)[0]
    return (ca, _PAIR_ALT) if ca == cb else (ca, cb)


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (files only, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str | Path) -> None:
    """Lay out, write as PNG and release the figure."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)


def trace_label(workload: Workload) -> str:
    """A workload's name and the changes made to it ('default; first 150 requests; rate x20')."""
    return "; ".join([workload.trace_name or "unnamed workload", *workload.changes])


def context_line(profile: Any, workload: Workload | None = None, methods: Sequence[str] = ()) -> str:
    """'model on hardware, topology; trace ...; methods' for a figure's title."""
    prov = getattr(profile, "provenance", None) or {}
    model = prov.get("model") or getattr(profile, "name", "?")
    hw = prov.get("hardware") or "hardware not stated"
    topo = (prov.get("topology") or {}).get("name") if isinstance(prov.get("topology"), dict) else None
    gpr = prov.get("gpus_per_replica")
    where = f"{topo}" if topo else (f"{gpr} GPU(s) per replica" if gpr else "")
    parts = [f"{model} on {hw}" + (f", {where}" if where else "")]
    if workload is not None:
        parts.append(f"trace {trace_label(workload)}")
    if methods:
        parts.append(" vs ".join(methods))
    return "; ".join(parts)


def _wrap(text: str, width_in: float, fontsize: float) -> str:
    """`text` wrapped to a width in inches (about 0.55 x the font size in points per character)."""
    import textwrap

    return textwrap.fill(text, max(20, int(width_in * 72 / (0.55 * fontsize))), break_on_hyphens=False)


def set_title(ax: Any, what: str, context: str = "") -> None:
    """The axes' title: what it shows, then what was simulated, wrapped to the axes' width."""
    if not context:
        ax.set_title(what, fontsize=10)
        return
    width = ax.get_position().width * ax.figure.get_figwidth()
    ax.set_title(f"{what}\n{_wrap(context, width, 8.5)}", fontsize=8.5)


def set_suptitle(fig: Any, context: str) -> None:
    """A figure-wide second title (what was simulated) over panels that share it."""
    if context:
        fig.suptitle(_wrap(context, fig.get_figwidth() * 0.95, 9), fontsize=9)


def _compact(v: float, _pos: Any = None) -> str:
    return f"{v / 1000:g}k" if v >= 10000 else f"{v:g}"


def readable_log_axis(ax: Any, axis: str = "x", values: Iterable[float] | None = None) -> None:
    """Plain-number major ticks on a log axis, no minor labels (call after plotting: the ticks
    follow the axis's range). At `values` (e.g. the concurrency levels) when given; else decades
    over 3 decades or more, 1-2-5 per decade over 1 to 3, and about five evenly spaced values over
    less than one (where a log axis is nearly linear and matplotlib labels its minor ticks)."""
    import math

    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, MaxNLocator, NullFormatter

    a = ax.xaxis if axis == "x" else ax.yaxis
    if values is not None:
        a.set_major_locator(FixedLocator(sorted({float(v) for v in values if v and v > 0})))
    else:
        lo, hi = sorted(ax.get_xlim() if axis == "x" else ax.get_ylim())
        decades = math.log10(hi / lo) if lo > 0 and hi > lo else 0.0
        if decades >= 3:
            a.set_major_locator(LogLocator(base=10, subs=(1.0,)))
        elif decades >= 1:
            a.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        else:
            a.set_major_locator(MaxNLocator(nbins=5, steps=[1, 2, 2.5, 5, 10]))
    a.set_major_formatter(FuncFormatter(_compact))
    a.set_minor_formatter(NullFormatter())


def sla_lines(ax: Any, slos: Iterable[Any], metric: str, axis: str = "x") -> None:
    """A dashed line at each SLA target of `metric` (dsim.study.sla.SLO terms, ms), labelled."""
    for s in slos:
        if getattr(s, "metric", None) != metric:
            continue
        line = ax.axvline if axis == "x" else ax.axhline
        line(s.target, color="#444", ls="--", lw=0.9, label=f"SLA: {s.describe()}")
