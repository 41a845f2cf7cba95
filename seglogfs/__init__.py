"""seglogfs: the faces of the ``storage`` engine, one package each.

- ``seglogfs.daemon``: the FUSE daemon (``seglogfs mount``): topics as directories,
  partitions as append-only files;
- ``seglogfs.cli``: the command line (``seglogfs``), one module per command family;
- ``seglogfs.control``: the control socket through which the command line and Spark
  write to a directory a running daemon owns (protocol, client, server);
- ``seglogfs.spark``: the ``seglog`` PySpark data source and sink;
- ``seglogfs.kafka``: Kafka's wire protocol, served in the daemon (``mount --kafka``).

Shared by the faces: ``positions`` (the position index every writer keeps),
``producer`` (the one produce path), ``setup_check`` (a set-up mistake named in one
line), ``open_files_limit``, ``properties`` (``--config`` keys the listeners read)
and ``byte_budget`` (the listeners' ``queued.max.request.bytes``). The layers are enforced
by ``tests/test_layering.py``: the command line imports nothing of the daemon but its
entry point, Spark neither the daemon nor the command line, and ``storage`` nothing of
``seglogfs``.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
