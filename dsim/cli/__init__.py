"""The `dsim` command: the typer app and core commands (`app`), the planning commands
(`plan_cli`), the profile builders' group (`profile_cli`), the whole command with plugged-in groups
(`entry`) and the exit contract of the module tools (`toolmain`). Kept empty: a tool that needs
only `toolmain` does not load typer."""
