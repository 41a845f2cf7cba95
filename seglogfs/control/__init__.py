"""The control socket: how commands write to a log directory a daemon owns.

- ``protocol``: the wire format (frames, the produce payload, error replies), shared;
- ``client``: ``request``, ``produce`` and ``daemon_socket``, used by the command line
  and the Spark sink; it imports no trio;
- ``admin``: the admin calls run the same way by the command line, the server and the
  file system (topic creation and config changes under the compaction rule, the
  cleaner's passes, ``seglogfs compact``); it imports no trio;
- ``server``: ``serve``, run by the daemon in its nursery, within the bounds of
  ``config`` (``ControlConfig``: Kafka's ``socket.request.max.bytes``,
  ``max.connections``, ... read from the daemon's ``server.properties``).

This package re-exports the client's API and the protocol's names a caller needs;
the server and its config are imported from ``seglogfs.control.server`` and
``seglogfs.control.config`` by the daemon alone.
"""

from .client import daemon_socket, produce, request
from .protocol import SOCKET_NAME, ControlError, ProduceRecord, describe_result, socket_path

__all__ = [
    "SOCKET_NAME",
    "ControlError",
    "ProduceRecord",
    "daemon_socket",
    "describe_result",
    "produce",
    "request",
    "socket_path",
]
