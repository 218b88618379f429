"""The HTTP/1.1 transport for httpx that hands whole network reads of a chunked body to the
caller (httpx's own spends ~10 µs per chunk in h11: at 1024 streams the client, not the engine,
would be the bottleneck), and the client built on it."""

from __future__ import annotations

import asyncio
import ssl

import httpx

from workers.loadgen.config import ClientConfig

# ---------------------------------------------------------------------------------------------
# HTTP/1.1 transport for httpx that hands whole reads of a chunked body to the caller
# ---------------------------------------------------------------------------------------------


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: a receive buffer and a waiter woken by new bytes or EOF."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.closed = False
        self._waiter: asyncio.Future | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self._wake()

    def eof_received(self) -> bool:
        self.closed = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self, timeout_s: float | None) -> None:
        """Wait for more bytes or EOF; httpx.ReadTimeout after timeout_s."""
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = None
        if timeout_s is not None:
            timer = loop.call_later(timeout_s, _expire, waiter)
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


def _expire(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_exception(httpx.ReadTimeout("no bytes from the server within the timeout"))


class _ResponseBody(httpx.AsyncByteStream):
    """The body of one response: chunked, Content-Length or read-to-close framing.

    Yields all payload bytes that one network read completed, so a burst of SSE events costs
    one iteration instead of one per HTTP chunk.
    """

    def __init__(self, conn, framing, length, release, read_timeout_s):
        self._conn = conn
        self._framing = framing
        self._remaining = length
        self._release = release
        self._read_timeout_s = read_timeout_s
        self._complete = False

    async def __aiter__(self):
        if self._framing == "chunked":
            async for data in self._chunked():
                yield data
        elif self._framing == "length":
            async for data in self._sized():
                yield data
        else:
            async for data in self._until_close():
                yield data

    async def _chunked(self):
        conn = self._conn
        buf = conn.buffer
        pos = 0
        while True:
            out = []
            while True:
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    break
                try:
                    size = int(bytes(buf[pos:eol]).split(b";", 1)[0], 16)
                except ValueError:
                    raise httpx.RemoteProtocolError("malformed chunk size in the body") from None
                if size == 0:
                    trailer_end = buf.find(b"\r\n", eol + 2)
                    if trailer_end == eol + 2:
                        del buf[: eol + 4]
                        self._complete = True
                        if out:
                            yield b"".join(out)
                        return
                    if b"\r\n\r\n" in buf[eol:]:
                        del buf[: buf.find(b"\r\n\r\n", eol) + 4]
                        self._complete = True
                        if out:
                            yield b"".join(out)
                        return
                    break
                end = eol + 2 + size
                if len(buf) < end + 2:
                    break
                out.append(bytes(buf[eol + 2 : end]))
                pos = end + 2
            if pos:
                del buf[:pos]
                pos = 0
            if out:
                yield b"".join(out)
            if conn.closed:
                raise httpx.RemoteProtocolError(
                    "peer closed connection without sending complete message body"
                )
            await conn.wait(self._read_timeout_s)

    async def _sized(self):
        conn = self._conn
        while self._remaining > 0:
            if conn.buffer:
                data = bytes(conn.buffer[: self._remaining])
                del conn.buffer[: len(data)]
                self._remaining -= len(data)
                yield data
                continue
            if conn.closed:
                raise httpx.RemoteProtocolError(
                    "peer closed connection without sending complete message body"
                )
            await conn.wait(self._read_timeout_s)
        self._complete = True

    async def _until_close(self):
        conn = self._conn
        while True:
            if conn.buffer:
                data = bytes(conn.buffer)
                conn.buffer.clear()
                yield data
                continue
            if conn.closed:
                return
            await conn.wait(self._read_timeout_s)

    async def aclose(self) -> None:
        self._release(self._conn, reusable=self._complete)


class HTTP1StreamTransport(httpx.AsyncBaseTransport):
    """An httpx transport over asyncio for many concurrent streamed HTTP/1.1 responses.

    One connection per in-flight request, idle ones kept for reuse, no cap on either (the
    caller's semaphore is the only limit). Raises httpx's own exceptions (ConnectError,
    ConnectTimeout, ReadTimeout, RemoteProtocolError) so callers handle it like httpx's pool.
    """

    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._ssl_context = ssl_context

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeouts = request.extensions.get("timeout", {})
        url = request.url
        key = (url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80))
        conn = await self._connection(key, timeouts.get("connect"))
        body = await request.aread()
        lines = [b"%s %s HTTP/1.1\r\n" % (request.method.encode(), url.raw_path)]
        lines += [name + b": " + value + b"\r\n" for name, value in request.headers.raw]
        lines.append(b"\r\n")
        conn.transport.write(b"".join(lines) + body)
        read_timeout = timeouts.get("read")
        while True:
            status, reason, headers = await self._read_head(conn, read_timeout)
            # 1xx interim responses (100 Continue) precede the real one.
            if not 100 <= status < 200:
                break
        names = {name.lower(): value for name, value in headers}
        keep_alive = names.get(b"connection", b"").lower() != b"close"
        if b"chunked" in names.get(b"transfer-encoding", b"").lower():
            framing, length = "chunked", 0
        elif b"content-length" in names:
            framing, length = "length", int(names[b"content-length"])
        else:
            framing, length, keep_alive = "close", 0, False
        if request.method == "HEAD" or status in (204, 304):
            framing, length = "length", 0

        def release(c: _Connection, *, reusable: bool) -> None:
            if reusable and keep_alive and not c.closed and not c.buffer:
                self._idle.setdefault(key, []).append(c)
            else:
                c.close()

        return httpx.Response(
            status,
            headers=headers,
            stream=_ResponseBody(conn, framing, length, release, read_timeout),
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": reason},
        )

    async def _connection(self, key: tuple[str, str, int], timeout_s: float | None):
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn.closed and not conn.buffer:
                return conn
            conn.close()
        scheme, host, port = key
        ssl_arg = None
        if scheme == "https":
            if self._ssl_context is None:
                self._ssl_context = ssl.create_default_context()
            ssl_arg = self._ssl_context
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout_s):
                _, conn = await loop.create_connection(
                    _Connection, host, port, ssl=ssl_arg, server_hostname=host if ssl_arg else None
                )
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connecting to {host}:{port} timed out") from None
        except OSError as exc:
            raise httpx.ConnectError(f"connecting to {host}:{port}: {exc}") from exc
        return conn

    async def _read_head(self, conn: _Connection, timeout_s: float | None):
        while True:
            end = conn.buffer.find(b"\r\n\r\n")
            if end >= 0:
                break
            if conn.closed:
                conn.close()
                raise httpx.RemoteProtocolError("server disconnected without sending a response")
            if len(conn.buffer) > 65536:
                conn.close()
                raise httpx.RemoteProtocolError("response head larger than 64 KiB")
            await conn.wait(timeout_s)
        head = bytes(conn.buffer[:end]).split(b"\r\n")
        del conn.buffer[: end + 4]
        parts = head[0].split(b" ", 2)
        try:
            status = int(parts[1])
        except (IndexError, ValueError):
            conn.close()
            raise httpx.RemoteProtocolError(f"malformed status line {head[0][:80]!r}") from None
        headers = []
        for line in head[1:]:
            name, _, value = line.partition(b":")
            headers.append((name.strip(), value.strip()))
        return status, (parts[2] if len(parts) > 2 else b""), headers

    async def aclose(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()


def make_client(client_cfg: ClientConfig) -> httpx.AsyncClient:
    """The httpx AsyncClient a level uses: no connection cap, timeouts from client_cfg."""
    timeout = httpx.Timeout(client_cfg.timeout_s, pool=None)
    if client_cfg.transport == "httpx":
        # httpx's default pool of 100 connections would silently cap the concurrency.
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        return httpx.AsyncClient(limits=limits, timeout=timeout)
    return httpx.AsyncClient(transport=HTTP1StreamTransport(), timeout=timeout)
