"""``python -m seglogfs.daemon LOGDIR MOUNTPOINT ...``: the same as ``seglogfs mount``."""

import os
import sys

from .mount import main

os.environ.setdefault("PYTHONUNBUFFERED", "1")
sys.exit(main())
