"""Blocking HTTP for Flotilla plugins, written directly on the raw wasi:http 0.2 bindings.

It owns one thing: sending one request and reading the whole answer, keeping wasi:http's own
error codes. A failure raises `HttpError`, whose `code` is the wasi:http `ErrorCode`
(`ErrorCode_HttpRequestDenied` when the host's allow-list or credential binding refused the
request, `ErrorCode_ConnectionRefused`, `ErrorCode_DnsError`, ...). It knows nothing of the
provider contract: mapping statuses and codes to contract errors is the plugin's job.

Why not componentize-py's bundled `poll_loop.py`: it imports `wit_world.imports.types`, which
does not exist in the provider world (two `types` interfaces, so the bindings are named
`wasi_http_types` and `flotilla_provider_types`). One blocking request per call is all a
plugin needs, so asyncio buys nothing here.

Limits: the answer is read whole into memory and capped at `MAX_BODY_BYTES`; no redirects are
followed; timeouts are the host's (every export call has a deadline).
"""

import re
from dataclasses import dataclass
from typing import Iterable, List, Optional, Tuple
from urllib.parse import urlsplit

from componentize_py_types import Err
from wit_world.imports import outgoing_handler, streams
from wit_world.imports import wasi_http_types as http

MAX_BODY_BYTES = 4 << 20
# wasi:io allows at most 4096 bytes per blocking-write-and-flush.
_WRITE_CHUNK = 4096
_READ_CHUNK = 64 << 10

_METHODS = {
    "GET": http.Method_Get, "HEAD": http.Method_Head, "POST": http.Method_Post,
    "PUT": http.Method_Put, "DELETE": http.Method_Delete, "PATCH": http.Method_Patch,
    "OPTIONS": http.Method_Options,
}


class HttpError(Exception):
    """The request failed below HTTP: `code` is the wasi:http `ErrorCode` the host gave."""

    def __init__(self, code: http.ErrorCode) -> None:
        self.code = code
        super().__init__(describe(code))


def describe(code: http.ErrorCode) -> str:
    """The WIT spelling of an error code, e.g. `HTTP-request-denied`, plus its payload."""
    words = re.findall(r"[A-Z][a-z0-9]*", type(code).__name__.removeprefix("ErrorCode_"))
    name = "-".join(w.upper() if w in ("Http", "Dns", "Tls") else w.lower() for w in words)
    value = getattr(code, "value", None)
    return name if value is None else f"{name} ({value})"


@dataclass
class Response:
    """A complete answer: status, headers (names in lower case) and body."""

    status: int
    headers: List[Tuple[str, bytes]]
    body: bytes

    def header(self, name: str) -> Optional[str]:
        """The first value of a header, decoded as Latin-1, or None."""
        name = name.lower()
        return next((v.decode("latin-1") for k, v in self.headers if k.lower() == name), None)


def request(method: str, url: str, headers: Iterable[Tuple[str, str]] = (),
            body: Optional[bytes] = None) -> Response:
    """Sends one request and blocks until its whole answer has arrived.

    Raises `HttpError` for transport failures and denials, `ValueError` for a malformed URL
    or header (a bug in the caller, not a network condition).
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"not an http(s) URL: {url!r}")
    try:
        fields = http.Fields.from_list([(k.lower(), v.encode()) for k, v in headers])
    except Err as e:
        raise ValueError(f"invalid request header: {e.value}") from None
    outgoing = http.OutgoingRequest(fields)
    method_case = _METHODS.get(method.upper())
    outgoing.set_method(method_case() if method_case else http.Method_Other(method))
    outgoing.set_scheme(http.Scheme_Https() if parts.scheme == "https" else http.Scheme_Http())
    try:
        outgoing.set_authority(parts.netloc)
        query = f"?{parts.query}" if parts.query else ""
        outgoing.set_path_with_query((parts.path or "/") + query)
    except Err:
        raise ValueError(f"invalid URL: {url!r}") from None
    out_body = outgoing.body()
    try:
        future = outgoing_handler.handle(outgoing, None)
    except Err as e:
        out_body.__exit__(None, None, None)
        raise HttpError(e.value) from None
    # Written after `handle`, so a host that buffers the body (to sign it) is not blocked.
    write_error = _write_body(out_body, body or b"")
    with future:
        incoming = _wait(future)
    # A refused request also breaks the body stream: the future's code says why, so it wins.
    if write_error is not None:
        incoming.__exit__(None, None, None)
        raise write_error
    with incoming:
        status = incoming.status()
        with incoming.headers() as fields:
            entries = fields.entries()
        data = _read_body(incoming.consume())
    return Response(status, entries, data)


def _write_body(out_body: http.OutgoingBody, data: bytes) -> Optional[HttpError]:
    try:
        with out_body.write() as stream:
            for start in range(0, len(data), _WRITE_CHUNK):
                stream.blocking_write_and_flush(data[start:start + _WRITE_CHUNK])
    except Err as e:
        out_body.__exit__(None, None, None)
        return HttpError(_stream_code(e.value, "writing the request body"))
    http.OutgoingBody.finish(out_body, None)
    return None


def _wait(future: http.FutureIncomingResponse) -> http.IncomingResponse:
    with future.subscribe() as ready:
        ready.block()
    got = future.get()
    if got is None or isinstance(got, Err):
        raise HttpError(http.ErrorCode_InternalError("response future gave no answer"))
    if isinstance(got.value, Err):
        raise HttpError(got.value.value)
    return got.value.value


def _read_body(body: http.IncomingBody) -> bytes:
    chunks, size = [], 0
    try:
        with body.stream() as stream:
            while True:
                try:
                    chunk = stream.blocking_read(_READ_CHUNK)
                except Err as e:
                    if isinstance(e.value, streams.StreamError_Closed):
                        break
                    raise HttpError(_stream_code(e.value, "reading the response body")) from None
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise HttpError(http.ErrorCode_HttpResponseBodySize(size))
                chunks.append(chunk)
    except BaseException:
        body.__exit__(None, None, None)
        raise
    http.IncomingBody.finish(body).__exit__(None, None, None)
    return b"".join(chunks)


def _stream_code(error: streams.StreamError, doing: str) -> http.ErrorCode:
    if isinstance(error, streams.StreamError_LastOperationFailed):
        with error.value as io_error:
            code = http.http_error_code(io_error)
            return code or http.ErrorCode_InternalError(f"{doing}: {io_error.to_debug_string()}")
    return http.ErrorCode_InternalError(f"{doing}: stream closed")
