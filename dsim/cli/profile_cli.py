"""`dsim profile`: a step-cost profile for one's own model from its config.json (dsim.profiling.own_model),
registered on dsim.cli.app's typer app (dsim.cli.entry imports this module)."""

from __future__ import annotations

from typing import Optional

import typer

from dsim.cli.app import app, run_guarded
from dsim.errors import InputError


@app.command("profile")
def profile(
    config: str = typer.Argument(..., help="the model's Hugging Face style config.json"),
    hardware: str = typer.Option("H200", help="GPU kind (dsim.profiling.own_model.hardware_kinds(): H200, B300, ...)"),
    out: str = typer.Option(..., help="profile YAML to write (use it with --profile)"),
    gpus: Optional[int] = typer.Option(
        None, help="dense: GPUs per replica (default: the fewest of 1, 2, 4, 8 that fit)"
    ),
    topology: Optional[str] = typer.Option(None, help="MoE: topology, e.g. dp8-ep8 (default) or tp8-ep8"),
    name: Optional[str] = typer.Option(None, help="profile name (default: from the model and hardware)"),
    force: bool = typer.Option(False, "--force", help="overwrite an existing --out file"),
) -> None:
    """Profile your own model: dense models through the analytical roofline, MoE models through the
    kernel-op composer; prints what is measured and what is assumed."""

    def go() -> None:
        from dsim.cost import save_profile
        from dsim.outputs import check_file_target, staged_file
        from dsim.profiling.own_model import describe, own_profile

        if gpus is not None and not 1 <= gpus <= 8:
            raise InputError(f"--gpus: must be 1 to 8 (one node), got {gpus}")
        if check_file_target(out, "--out").exists() and not force:
            raise InputError(f"--out {out}: exists (--force overwrites it)")
        try:
            prof = own_profile(config, hardware, gpus=gpus, topology=topology, name=name)
        except KeyError as e:
            raise InputError(f"{config}: missing key {e.args[0]!r}") from None
        with staged_file(out, "--out") as stage:
            save_profile(prof, stage)
        for line in describe(prof):
            typer.echo(line)
        typer.echo(f"wrote {out} (use it: dsim plan --profile {out} --sla ...)")

    run_guarded(go)
