"""seglogfs: the file-system, command-line and Spark faces of the ``storage`` engine.

The FUSE daemon, the CLI and the Spark data source are built on ``storage`` in later
work; this package currently holds only the version.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
