from dsim.cli.toolmain import startup_guard

startup_guard("dsim")  # a Ctrl-C while the modules load: quiet exit 130 (dsim.cli.app takes over)

from dsim.cli.entry import main  # noqa: E402
from dsim.cli.toolmain import release_startup_guard  # noqa: E402

release_startup_guard()  # dsim.cli.app.main installs the handlers that clean up staged outputs

main()
