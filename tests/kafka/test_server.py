"""The listener in-process (pytest-trio, no mount): a handler that fails answers its
request with ``UNKNOWN_SERVER_ERROR`` and the connection goes on, logged with one
traceback per API and error type."""

from __future__ import annotations

import io
import logging
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from seglogfs.kafka import dispatch
from seglogfs.kafka.api_versions import handle_api_versions
from seglogfs.kafka.broker import Broker
from seglogfs.kafka.codec import Request, build
from seglogfs.kafka.config import KafkaConfig
from seglogfs.kafka.server import serve
from seglogfs.positions import position_index_spec
from storage import ConfigError, LogManager


async def _run_sync(fn: Any, *args: Any) -> Any:
    return await trio.to_thread.run_sync(fn, *args)


@pytest.fixture
def manager(log_dir: Path) -> Iterator[LogManager]:
    with LogManager.open(log_dir, extension=position_index_spec) as manager:
        yield manager


async def _call(stream: trio.SocketStream, correlation: int, padding: int = 0) -> Any:
    body = build(load_request_schema(18, 3), client_software_name="t", client_software_version="1")
    out = io.BytesIO()
    header_cls = type(body).__header_schema__
    entity_writer(header_cls)(
        out,
        header_cls(
            request_api_key=18, request_api_version=3, correlation_id=correlation, client_id="t"
        ),
    )
    entity_writer(type(body))(out, body)
    payload = out.getvalue() + b"\0" * padding
    await stream.send_all(struct.pack(">i", len(payload)) + payload)
    data = b""
    while len(data) < 4 or len(data) < 4 + struct.unpack_from(">i", data)[0]:
        chunk = await stream.receive_some(65536)
        assert chunk, "connection closed"
        data += chunk
    assert struct.unpack_from(">i", data, 4)[0] == correlation
    response, _ = entity_reader(load_response_schema(18, 3))(data, 8)
    return response


@pytest.mark.trio
async def test_a_failing_handler_answers_unknown_server_error(
    manager: LogManager, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls = 0

    async def broken(broker: Broker, request: Request) -> Any:
        nonlocal calls
        calls += 1
        if calls <= 2:
            raise RuntimeError("a bug")
        return await handle_api_versions(broker, request)

    monkeypatch.setitem(dispatch.HANDLERS, 18, broken)
    caplog.set_level(logging.INFO, logger="seglogfs.kafka")
    async with trio.open_nursery() as nursery:
        host, port = await nursery.start(serve, manager, _run_sync, KafkaConfig(port=0))
        stream = await trio.open_tcp_stream(host, port)
        async with stream:
            first = await _call(stream, 1)
            second = await _call(stream, 2)
            third = await _call(stream, 3)
        nursery.cancel_scope.cancel()
    assert first.error_code == second.error_code == ErrorCode.unknown_server_error
    assert third.error_code == ErrorCode.none
    assert third.api_keys
    tracebacks = [r for r in caplog.records if r.exc_info is not None]
    assert len(tracebacks) == 1
    assert "ApiVersions v3 failed" in tracebacks[0].getMessage()
    assert sum("failed: RuntimeError('a bug')" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.trio
async def test_queued_max_request_bytes_makes_a_frame_wait(
    manager: LogManager, caplog: pytest.LogCaptureFixture
) -> None:
    """Frames being read or served hold at most queued.max.request.bytes: a connection
    that stops inside a large frame holds its size, another's frame that does not fit
    waits unread, and is answered as soon as the first frame's bytes are released."""
    caplog.set_level(logging.INFO, logger="seglogfs.kafka")
    config = KafkaConfig(port=0, socket_request_max_bytes=1500, queued_max_request_bytes=2000)
    async with trio.open_nursery() as nursery:
        host, port = await nursery.start(serve, manager, _run_sync, config)
        holder = await trio.open_tcp_stream(host, port)
        # A frame of 1500 bytes, 10 of them sent: the listener holds 1500 while it reads.
        await holder.send_all(struct.pack(">i", 1500) + b"\0" * 10)
        await trio.sleep(0.2)
        waiting = await trio.open_tcp_stream(host, port)
        async with waiting:
            # Small requests fit beside it (ApiVersions is about 30 bytes) ...
            assert (await _call(waiting, 1)).error_code == ErrorCode.none
            # ... one padded to 600 bytes (bytes after a body are ignored) does not.
            answered: list[Any] = []
            done = trio.Event()

            async def padded() -> None:
                answered.append(await _call(waiting, 2, padding=600))
                done.set()

            nursery.start_soon(padded)
            await trio.sleep(1.0)
            assert answered == []  # waiting, its frame unread
            await holder.aclose()  # the 1500 bytes are released
            with trio.fail_after(10):
                await done.wait()
            assert answered[0].error_code == ErrorCode.none
        nursery.cancel_scope.cancel()
    assert any(
        "queued.max.request.bytes=2000 held by requests being read or served" in r.getMessage()
        for r in caplog.records
    )


def test_queued_max_request_bytes_is_not_below_the_frame_bound() -> None:
    with pytest.raises(ConfigError, match=r"queued\.max\.request\.bytes"):
        KafkaConfig.from_settings(
            {"socket.request.max.bytes": "2000", "queued.max.request.bytes": "1000"}, ":0"
        )
    with pytest.raises(ConfigError, match=r"queued\.max\.request\.bytes"):
        KafkaConfig.from_settings({"queued.max.request.bytes": "0"}, ":0")
    unbounded = KafkaConfig.from_settings({"queued.max.request.bytes": "-1"}, ":0")
    assert unbounded is not None
    assert unbounded.queued_bytes_bound is None
    assert KafkaConfig().queued_bytes_bound == 104857600
