"""Kafka's request/response framing over kio's generated message types.

A Kafka frame is a 4-byte big-endian size and that many bytes: a request header
(``RequestHeader`` v1, or v2 for flexible versions: tagged fields after the client id)
and the request body; a response is a response header (v0: the correlation id; v1 for
flexible versions: plus an empty tagged-field section; ApiVersions always v0, so a
client that does not know the broker's versions can read it) and the body.

The message bodies are kio's dataclasses, generated from Kafka's JSON schemas
(``clients/src/main/resources/common/message/``), one class per API, version and
nested struct: this module only picks the class, and ``build`` fills a response of
any version from version-agnostic field values (a field the version lacks is
dropped, one the caller did not give takes its schema default or its type's zero).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import os
import struct
import typing
import uuid
from dataclasses import dataclass
from typing import Any, Final

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.response_header.v1.header import ResponseHeader as FlexibleResponseHeader
from kio.serial import entity_reader, entity_writer

from storage import FetchData, FileRegion

__all__ = [
    "FRAME_SIZE",
    "ErrorCode",
    "MalformedRequest",
    "Request",
    "ResponseFrame",
    "build",
    "decode_request",
    "encode_response",
    "error_response",
    "request_class",
    "response_class",
]

FRAME_SIZE: Final = struct.Struct(">i")
"""The size prefix of every frame."""

_KEY_VERSION_ID: Final = struct.Struct(">hhi")
"""The first fields of every request header: api key, api version, correlation id."""

API_VERSIONS_KEY: Final = 18


class MalformedRequest(Exception):
    """A frame that is not a Kafka request: the connection is closed (as Kafka's
    ``SocketServer`` closes it on an ``InvalidRequestException``)."""


@dataclass(frozen=True)
class Request:
    """One decoded request: the header's fields and the body (``body`` is None when
    this broker does not answer the API key and version, which it then answers with
    ``UNSUPPORTED_VERSION`` without reading the body)."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any
    peer_host: str = ""
    """The client's address (the server sets it: JoinGroup records it as the host)."""


# Bounded: clients choose the keys and versions looked up (unsupported ones too).
@functools.lru_cache(maxsize=1024)
def request_class(api_key: int, api_version: int) -> type[Any] | None:
    """kio's request class of an API version, None when kio has none."""
    try:
        return load_request_schema(api_key, api_version)
    except Exception:  # kio's UnknownAPIKey/UnknownEntity, or an import of a gap
        return None


@functools.lru_cache(maxsize=1024)
def response_class(api_key: int, api_version: int) -> type[Any] | None:
    """kio's response class of an API version, None when kio has none."""
    try:
        return load_response_schema(api_key, api_version)
    except Exception:
        return None


def decode_request(frame: bytes, supported: typing.Callable[[int, int], bool]) -> Request:
    """Decode one frame (without its size prefix). The body is decoded only when
    ``supported(api_key, api_version)``; else ``body`` is None.

    Raises:
        MalformedRequest: the frame is too short or its header or body does not
            decode as the schema of its API key and version says.
    """
    if len(frame) < _KEY_VERSION_ID.size:
        raise MalformedRequest(f"a frame of {len(frame)} bytes holds no request header")
    api_key, api_version, correlation_id = _KEY_VERSION_ID.unpack_from(frame)
    cls = request_class(api_key, api_version) if supported(api_key, api_version) else None
    if cls is None:
        # Kafka answers a version it does not know without reading the body; the header
        # is read only as far as the client id (a v1 header's prefix of every version).
        return Request(api_key, api_version, correlation_id, None, None)
    try:
        header, used = entity_reader(cls.__header_schema__)(frame, 0)
        body, _ = entity_reader(cls)(frame, used)
    except Exception as exc:  # kio raises its own errors, struct's, or UnicodeDecodeError
        raise MalformedRequest(
            f"api key {api_key} version {api_version}: {type(exc).__name__}: {exc}"
        ) from None
    # Bytes after the body are ignored, not refused: the admin
    # client of confluent-kafka 2.16.1 (librdkafka 2.16.0) sends a Metadata v12 request
    # with 3 bytes after its body (list_topics failed when they closed the connection).
    return Request(api_key, api_version, correlation_id, header.client_id, body)


class ResponseFrame:
    """A response's frame (size prefix, header, body) as the parts to send in order:
    encoded bytes, and the ``FileRegion``s of stored records (a Fetch's ``FetchData``,
    sent from their files: see ``send``). Close it once sent, or not sent: it owns the
    regions' descriptors."""

    __slots__ = ("parts", "size")

    def __init__(self, parts: list[bytes | FileRegion]) -> None:
        self.parts = parts
        self.size = sum(len(p) if isinstance(p, bytes) else p.size for p in parts)

    @classmethod
    def of(cls, data: bytes) -> ResponseFrame:
        """A frame already encoded whole."""
        return cls([data])

    def to_bytes(self) -> bytes:
        """The whole frame, regions read now (tests)."""
        return b"".join(
            p if isinstance(p, bytes) else os.pread(p.fd, p.size, p.position) for p in self.parts
        )

    def close(self) -> None:
        for part in self.parts:
            if isinstance(part, FileRegion):
                part.close()


class _FrameWriter:
    """kio's output stream for a frame: bytes are gathered; a ``FetchData`` (kio
    wrote its length already) becomes its parts, its regions not read."""

    def __init__(self) -> None:
        self.parts: list[bytes | FileRegion] = []
        self._pending = bytearray()

    def write(self, data: bytes | FetchData) -> int:
        if isinstance(data, FetchData):
            for part in data.parts:
                if isinstance(part, FileRegion):
                    self._end_bytes()
                    self.parts.append(part)
                else:
                    self._pending += part
            data.parts = []  # the frame owns the regions now
            return data.size
        self._pending += data
        return len(data)

    def _end_bytes(self) -> None:
        if self._pending:
            self.parts.append(bytes(self._pending))
            self._pending = bytearray()

    def frame(self) -> ResponseFrame:
        """The frame, its size prefix (the first 4 bytes written) set."""
        if not self.parts:  # all bytes: set the size in place, no copy
            FRAME_SIZE.pack_into(self._pending, 0, len(self._pending) - FRAME_SIZE.size)
        self._end_bytes()
        frame = ResponseFrame(self.parts)
        first = frame.parts[0]
        assert isinstance(first, bytes)
        if len(frame.parts) > 1:  # the first part is the header: small
            size = FRAME_SIZE.pack(frame.size - FRAME_SIZE.size)
            frame.parts[0] = size + first[FRAME_SIZE.size :]
        return frame


def encode_response(correlation_id: int, response: Any) -> ResponseFrame:
    """The frame of a response (size prefix, header, body). A records field holding
    a ``FetchData`` is not copied: its regions become parts of the frame."""
    out = _FrameWriter()
    out.write(b"\0\0\0\0")  # the size, set once the frame is whole
    out.write(struct.pack(">i", correlation_id))
    if type(response).__header_schema__ is FlexibleResponseHeader:
        out.write(b"\0")  # no tagged fields in the header
    # kio asks for a binary stream; it calls only ``write``.
    entity_writer(type(response))(typing.cast(typing.IO[bytes], out), response)
    return out.frame()


def error_response(api_key: int, api_version: int, code: ErrorCode) -> Any | None:
    """A response of ``api_key``/``api_version`` with ``code`` as its top-level error
    code (where the version has one) and empty arrays; None when kio has no schema
    for it."""
    cls = response_class(api_key, api_version)
    if cls is None:
        return None
    return build(cls, error_code=code)


# -- building responses ----------------------------------------------------------------


_HINTS: dict[type[Any], dict[str, Any]] = {}
_FIELDS: dict[type[Any], dict[str, dataclasses.Field[Any]]] = {}


def _hints(cls: type[Any]) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


def _fields(cls: type[Any]) -> dict[str, dataclasses.Field[Any]]:
    fields = _FIELDS.get(cls)
    if fields is None:
        fields = _FIELDS[cls] = {f.name: f for f in dataclasses.fields(cls)}
    return fields


def build(cls: type[Any], /, **values: Any) -> Any:
    """An instance of kio's dataclass ``cls`` from ``values``: keys the class lacks
    (fields of other versions) are ignored; fields not given take their default, or
    the zero of their type (0, "", b"", False, the nil UUID, empty arrays, a nested
    struct built the same way, None where nullable). Plain ints become ``ErrorCode``
    and ``timedelta`` where the schema says so, and a dict for a nested struct is
    built as that struct (so callers write version-agnostic code)."""
    fields = _fields(cls)
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for name, field in fields.items():
        if name in values:
            kwargs[name] = _coerce(field, hints[name], values[name])
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            kwargs[name] = _zero(field, hints[name])
    return cls(**kwargs)


def _coerce(field: dataclasses.Field[Any], hint: Any, value: Any) -> Any:
    kafka_type = field.metadata.get("kafka_type")
    if value is None:
        return None
    if kafka_type == "error_code" and not isinstance(value, ErrorCode):
        return ErrorCode(value)
    if kafka_type in ("timedelta_i32", "timedelta_i64") and isinstance(value, int):
        return datetime.timedelta(milliseconds=value)
    if kafka_type == "datetime_i64" and isinstance(value, int):
        # kio reads Kafka's -1 ("none") of a nullable timestamp as None.
        if value < 0 and type(None) in typing.get_args(hint):
            return None
        return datetime.datetime.fromtimestamp(value / 1000, datetime.UTC)
    if isinstance(value, dict):
        return build(_entity_of(hint), **value)
    if isinstance(value, list | tuple):
        if any(isinstance(item, dict) for item in value):
            entity = _entity_of(hint)
            return tuple(
                build(entity, **item) if isinstance(item, dict) else item for item in value
            )
        return tuple(value)
    return value


def _entity_of(hint: Any) -> type[Any]:
    """The dataclass inside ``X``, ``X | None`` or ``tuple[X, ...]``."""
    for arg in (hint, *typing.get_args(hint)):
        if dataclasses.is_dataclass(arg) and isinstance(arg, type):
            return arg
        inner = typing.get_args(arg)
        if inner and dataclasses.is_dataclass(inner[0]) and isinstance(inner[0], type):
            return inner[0]
    raise TypeError(f"no message struct in {hint!r}")


def _zero(field: dataclasses.Field[Any], hint: Any) -> Any:
    kafka_type = field.metadata.get("kafka_type")
    args = typing.get_args(hint)
    if type(None) in args and kafka_type != "error_code":
        return None
    if kafka_type is None:
        origin = typing.get_origin(hint)
        if origin is tuple or any(typing.get_origin(a) is tuple for a in args):
            return ()
        return build(_entity_of(hint))
    zeros: dict[str, Any] = {
        "string": "",
        "bytes": b"",
        "records": b"",
        "bool": False,
        "uuid": uuid.UUID(int=0),
        "error_code": ErrorCode.none,
        "timedelta_i32": datetime.timedelta(0),
        "timedelta_i64": datetime.timedelta(0),
        "float64": 0.0,
    }
    return zeros.get(kafka_type, 0)
