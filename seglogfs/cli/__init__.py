"""The command line, ``seglogfs`` (SPEC §4): one module per command family.

- ``main``: the parser and the rules that turn errors into exit codes; ``main()`` is
  the console script;
- ``common``: exit codes, ``UsageError``/``CommandError``, the log directory options;
- ``topics``, ``produce``, ``consume``, ``dump``, ``verify``, ``mount``: the commands
  (``mount`` hands over to ``seglogfs.daemon``, imported only then);
- ``demo``: the quick start's demonstration (``python -m seglogfs.cli.demo``).

Commands that write go through the daemon's control socket when one owns the log
directory (``seglogfs.control``); nothing here imports the daemon but ``mount``.
"""

from .main import main

__all__ = ["main"]
