"""The control socket: how commands write to a log directory a daemon owns.

- ``protocol``: the wire format (frames, the produce payload, error replies), shared;
- ``client``: ``request``, ``produce`` and ``daemon_socket``, used by the command line
  and the Spark sink; it imports no trio;
- ``server``: ``serve``, run by the daemon in its nursery.

This package re-exports the client's API and the protocol's names a caller needs;
the server is imported from ``seglogfs.control.server`` by the daemon alone.
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
