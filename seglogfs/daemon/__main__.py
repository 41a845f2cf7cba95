"""``python -m seglogfs.daemon LOGDIR MOUNTPOINT ...``: the same as ``seglogfs mount``."""

import os
import sys

from .mount import exit_when_done, main

os.environ.setdefault("PYTHONUNBUFFERED", "1")
# After a mount, exit as soon as the work is done, without the interpreter's teardown.
sys.exit(exit_when_done(main()))
