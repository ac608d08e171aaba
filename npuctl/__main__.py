"""``python -m npuctl``."""

import sys

from npuctl.main import main

sys.exit(main())
