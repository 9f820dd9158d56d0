"""``python -m tray.simtest``: the default sweep, or ``--seed N`` to replay."""

import sys

from .cli import main

sys.exit(main())
