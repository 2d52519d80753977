"""What a GPU-hour costs, per GPU kind, with the public quote each figure comes from.

``gpu_kind(hardware)`` reads the GPU kind out of a profile's ``provenance.hardware`` ("8 x NVIDIA
H200 SXM" -> "H200"); ``price_for(hardware, given)`` -> :class:`Price`: the user's own figure when
given, else the kind's public quote, else no figure at all (``per_gpu_hour`` None, with the reason).
A GPU kind is never priced at another kind's quote.

Each quote is one provider's public list price on one date, per GPU-hour. H100, H200 and B200 come
from one snapshot of one provider (so their ratios are not provider mark-ups); a kind that provider
did not list comes from the nearest public quote, with its own source and date. Where no single
public quote could be found (B300: only a market range), the kind has no figure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dsim.errors import InputError

_SPHERON_JUNE = (
    "Spheron GPU offers API (GET app.spheron.ai/api/gpu-offers), as published in Spheron's "
    "'GPU Spot Instance Arbitrage' article (spheron.network/blog/gpu-spot-instance-arbitrage-2026)"
)


@dataclass(frozen=True)
class Quote:
    """One GPU kind's public price: USD per GPU-hour on demand and on spot (None: no public quote)."""

    gpu: str
    on_demand: float | None
    spot: float | None
    source: str
    date: str | None
    note: str = ""


#: GPU kind -> public quote. Update a row with its source and date; never fill a kind from another.
PRICES: dict[str, Quote] = {
    "H100": Quote("H100", 5.07, 2.91, _SPHERON_JUNE, "3 Jun 2026", "H100 SXM5"),
    "H200": Quote("H200", 5.55, 3.31, _SPHERON_JUNE, "3 Jun 2026", "H200 SXM5"),
    "B200": Quote("B200", 8.32, 2.68, _SPHERON_JUNE, "3 Jun 2026", "B200 SXM6"),
    "GB200": Quote(
        "GB200",
        4.54,
        None,
        "Spheron, 'NVIDIA H200 vs B200 vs GB200' (spheron.network/blog/nvidia-h200-vs-b200-vs-gb200)",
        "17 Mar 2026",
        "$9.08 per GB200 Superchip of two Blackwell GPUs, halved",
    ),
    "B300": Quote(
        "B300",
        None,
        None,
        "",
        None,
        "only a market range was found (Ornn's 2026 rental benchmark: $5.00-7.25 on demand at neoclouds), "
        "not one provider's quote",
    ),
}

# A kind stands alone (no letter or digit either side: "GB200" is not read as "B200"), or is
# counted as hardware writes it: "8xH200", "H200x8"; an underscore separates ("H100_SXM").
_KIND = re.compile(
    r"(?:(?<![A-Za-z0-9])|(?<=\dx))(GB300|GB200|B300|B200|H200|H100)(?:(?![A-Za-z0-9])|(?=x\d))", re.IGNORECASE
)


def gpu_kind(hardware: str | None) -> str | None:
    """The GPU kind a hardware description names ("8 x NVIDIA H200 SXM" -> "H200"); None when it
    names none of the kinds this module knows (or names two, which no single price fits)."""
    if not hardware:
        return None
    kinds = {m.upper() for m in _KIND.findall(str(hardware))}
    return kinds.pop() if len(kinds) == 1 else None


@dataclass(frozen=True)
class Price:
    """The price a plan or report uses: per GPU-hour (None: no dollar figure), spot (None: none),
    where it comes from, and the GPU kind it was looked up for."""

    per_gpu_hour: float | None
    spot_per_gpu_hour: float | None
    source: str
    date: str | None
    gpu: str | None

    def describe(self) -> str:
        if self.per_gpu_hour is None:
            return self.source
        return f"${self.per_gpu_hour:.2f}/GPU-hour; {self.source}"


def price_for(hardware: str | None, given: float | None = None) -> Price:
    """The price of a GPU-hour of `hardware` (a profile's provenance.hardware): `given` (the
    user's --price-per-gpu-hour) when set, else the kind's public quote, else none."""
    kind = gpu_kind(hardware)
    if given is not None:
        if not (isinstance(given, (int, float)) and given > 0 and given < float("inf")):
            raise InputError(f"--price-per-gpu-hour: must be a finite number > 0, got {given}")
        return Price(float(given), None, "given on the command line (--price-per-gpu-hour)", None, kind)
    q = PRICES.get(kind) if kind else None
    if q is None or q.on_demand is None:
        what = (
            f"the profile's hardware ({hardware})" if hardware else "the profile's hardware (its provenance names none)"
        )
        why = (
            q.note
            if q is not None
            else f"dsim has no public quote for {kind}"
            if kind
            else "no GPU kind dsim has a price for"
        )
        return Price(
            None,
            None,
            f"no dollar figure: {what}: {why}; pass --price-per-gpu-hour for one",
            None,
            kind,
        )
    spot = f"${q.spot:.2f} spot" if q.spot is not None else "no spot quote"
    return Price(
        q.on_demand,
        q.spot,
        f"public {q.gpu} on-demand quote ({q.note}; {spot}): {q.source}, {q.date}",
        q.date,
        kind,
    )
