"""Sending a response frame: its bytes with ``send_all``, its stored records with
``os.sendfile`` from their segment files (Kafka's ``transferTo``).

``sendfile`` runs in the event loop on the non-blocking socket: each call moves what
the socket buffer takes, then the task waits for the socket to drain as ``send_all``
does, so a slow consumer holds no thread. It reads the file through the page cache,
where ``Log.fetch`` just brought the bytes when it checked them, so it does not wait
for the disk (Kafka's network threads can: KAFKA-7504).
"""

from __future__ import annotations

import os

import trio

from storage import FileRegion

from .codec import ResponseFrame

__all__ = ["send_frame"]


async def send_frame(stream: trio.SocketStream, frame: ResponseFrame) -> None:
    """Send ``frame`` whole (the caller closes it).

    Raises:
        trio.BrokenResourceError: the connection broke, or a region's file ended
            before its bytes were sent (the frame is then cut short: the connection
            cannot go on).
        trio.ClosedResourceError: the stream was closed.
    """
    for part in frame.parts:
        if isinstance(part, FileRegion):
            await _send_region(stream, part)
        else:
            await stream.send_all(part)


async def _send_region(stream: trio.SocketStream, region: FileRegion) -> None:
    sock = stream.socket
    position, left = region.position, region.size
    while left:
        try:
            sent = os.sendfile(sock.fileno(), region.fd, position, left)
        except BlockingIOError:
            await trio.lowlevel.wait_writable(sock)
            continue
        except OSError as exc:  # EPIPE, ECONNRESET, a closed socket (EBADF)
            raise trio.BrokenResourceError(f"sendfile: {exc}") from exc
        if sent == 0:
            raise trio.BrokenResourceError(
                f"{region.path} ended {left} bytes before the stored records sent from it"
            )
        position += sent
        left -= sent
        # A reader that keeps up never blocks the loop: let the other tasks run.
        await trio.lowlevel.checkpoint()
