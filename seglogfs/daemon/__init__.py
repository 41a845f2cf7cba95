"""The FUSE daemon: ``seglogfs mount LOGDIR MOUNTPOINT`` (SPEC §3).

- ``mount``: the lifecycle (open the engine, mount, one nursery, signals, systemd
  notification, clean unmount); ``python -m seglogfs.daemon`` runs it;
- ``operations``: the pyfuse3 handler class, joined from ``namespace`` (lookup,
  readdir, getattr, mkdir, xattrs), ``read_path`` (open, read, render-process fills) and
  ``write_path`` (write, flush, fsync, release) over the shared ``state``;
- ``nodes``: what inodes and file handles denote; ``handler`` and ``errno_map``: the one
  error boundary and errno table; ``views``: ``P@<where>`` names;
- ``position_reader``: the reads of one open file (positions, gaps, kept bytes);
  ``lines``: bytes written to records;
- ``renderer`` and ``render_process``: rendering on the other core into shared slots;
- ``maintenance``: roll by time and retention in the background;
- ``sd_notify`` and ``malloc_tuning``: systemd's protocol and the process's allocator.

Nothing outside this package imports it but the command line's ``mount`` command (and
the ``python -m seglogfs.mount`` alias), and ``metrics``, which the control socket
counts into (the Kafka listener is given the counters: ``seglogfs.kafka`` imports no
other face).
"""
