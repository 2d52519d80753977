"""`dsim profile`: the profile builders as one command group, registered on dsim.cli.app's typer
app (dsim.cli.entry imports this module):

- ``dsim profile model CONFIG``: a step-cost profile for one's own model from its config.json
  (dsim.profiling.own_model);
- ``dsim profile upgrade FILE``: an older format's profile rewritten in the current one
  (dsim.cost.profile.upgrade_profile_file; every loader upgrades on read, this writes it back);
- ``dsim profile compose ...``, ``dsim profile aic ...``, ``dsim profile deepep ...``: the argparse
  tools of dsim.profiling.compose_cli, .aic_tables and .deepep_tables, given the rest of the command
  line as it is (``--help`` included). They keep their exit contract (dsim.cli.toolmain: 2 for bad
  input, 130 / 143 on Ctrl-C / SIGTERM); each module also runs as ``python3 -m``.
"""

from __future__ import annotations

import importlib
from typing import Optional

import typer

from dsim.cli.app import app, run_guarded
from dsim.errors import InputError

profile_app = typer.Typer(
    help="Build step-cost profiles: your own model's (model), a composed MoE profile (compose), "
    "AIConfigurator's silicon tables (aic), DeepEP all-to-all tables (deepep); rewrite an older "
    "format's profile in the current one (upgrade).",
    no_args_is_help=True,
)
app.add_typer(profile_app, name="profile")

# subcommand -> (module whose argparse main it runs, what it does)
TOOLS = {
    "compose": ("dsim.profiling.compose_cli", "A MoE model's step-cost profile under a topology, from kernel tables"),
    "aic": ("dsim.profiling.aic_tables", "AIConfigurator's silicon tables priced into kernel tables and profiles"),
    "deepep": (
        "dsim.profiling.deepep_tables",
        "Inter-node all-to-all kernel tables from AIConfigurator's DeepEP data or DeepEP's published ones",
    ),
}


@profile_app.command("model")
def model(
    config: str = typer.Argument(..., help="the model's Hugging Face style config.json"),
    hardware: str = typer.Option("H200", help="GPU kind (dsim.profiling.own_model.hardware_kinds(): H200, B300, ...)"),
    out: str = typer.Option(..., help="profile YAML to write (use it with --profile)"),
    gpus: Optional[int] = typer.Option(
        None, help="dense: GPUs per replica (default: the fewest of 1, 2, 4, 8 that fit)"
    ),
    topology: Optional[str] = typer.Option(None, help="MoE: topology, e.g. dp8-ep8 (default) or tp8-ep8"),
    name: Optional[str] = typer.Option(None, help="profile name (default: from the model and hardware)"),
    backend: str = typer.Option(
        "vllm", help="MoE: serving backend whose silicon kernel tables price it (vllm, sglang, trtllm)"
    ),
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
            prof = own_profile(config, hardware, gpus=gpus, topology=topology, name=name, backend=backend)
        except KeyError as e:
            raise InputError(f"{config}: missing key {e.args[0]!r}") from None
        with staged_file(out, "--out") as stage:
            save_profile(prof, stage)
        for line in describe(prof):
            typer.echo(line)
        typer.echo(f"wrote {out} (use it: dsim plan --profile {out} --sla ...)")

    run_guarded(go)


@profile_app.command("upgrade")
def upgrade(
    file: str = typer.Argument(..., help="a profile YAML or JSON file of any supported format"),
    out: Optional[str] = typer.Option(None, help="write the upgraded profile here"),
    in_place: bool = typer.Option(False, "--in-place", help="rewrite FILE itself"),
    force: bool = typer.Option(False, "--force", help="overwrite an existing --out file"),
) -> None:
    """Rewrite a profile of an older format in the current one (every command reads older files
    the same way on load); the provenance notes the upgrade. Nothing is written for a file already
    current, one that is inconsistent or one that would not load."""

    def go() -> None:
        from dsim.cost.profile import upgrade_profile_file
        from dsim.cost.profile_upgrade import FORMAT_VERSION
        from dsim.outputs import check_file_target

        if (out is None) == (not in_place):
            raise InputError("give --out FILE or --in-place (one of them)")
        if out is not None and check_file_target(out, "--out").exists() and not force:
            raise InputError(f"--out {out}: exists (--force overwrites it)")
        target, what = (out, "--out") if out is not None else (file, "--in-place")
        version = upgrade_profile_file(file, target, what)
        if version == FORMAT_VERSION:
            typer.echo(f"{file}: already format_version {FORMAT_VERSION}; nothing written")
        else:
            typer.echo(f"wrote {target}: format_version {version} -> {FORMAT_VERSION}")

    run_guarded(go)


def _tool(module: str):
    def run(ctx: typer.Context) -> None:
        # imported on use: the builders load numpy tables and numba code the other commands never need
        rc = importlib.import_module(module).main(list(ctx.args))
        raise typer.Exit(rc)

    return run


for _name, (_module, _what) in TOOLS.items():
    profile_app.command(
        _name,
        help=f"{_what} (the arguments of python3 -m {_module}; --help lists them)",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
        add_help_option=False,
    )(_tool(_module))
