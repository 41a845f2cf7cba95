"""``python -m seglogfs.cli``: the same as the ``seglogfs`` console script."""

import sys

from .main import main

sys.exit(main())
