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
from storage import LogManager


async def _run_sync(fn: Any, *args: Any) -> Any:
    return await trio.to_thread.run_sync(fn, *args)


@pytest.fixture
def manager(log_dir: Path) -> Iterator[LogManager]:
    with LogManager.open(log_dir, extension=position_index_spec) as manager:
        yield manager


async def _call(stream: trio.SocketStream, correlation: int) -> Any:
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
    payload = out.getvalue()
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
