"""``python -m devices.agent``: start the node agent."""

import sys

if sys.version_info < (3, 11):  # noqa: UP036 - nodes may carry an older system Python; say so plainly
    sys.exit(f"npuportal-agent needs Python 3.11 or newer; this is {sys.version.split()[0]}")

from devices.agent.cli import main  # imported only after the version check

sys.exit(main())
