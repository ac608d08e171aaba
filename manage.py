#!/usr/bin/env python
"""Django's command-line entry point (see :mod:`npuportal.commandline` for its exit codes)."""

import sys

if __name__ == "__main__":
    from npuportal.commandline import main

    sys.exit(main(sys.argv))
