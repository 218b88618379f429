"""Concurrency-sweep load generator for OpenAI-compatible engines (SGLang, vLLM, the stand-in).

One level = N streamed requests of fixed input/output length at a fixed concurrency (optionally with
Poisson arrivals), measured the way `vllm bench serve` measures (docs/metrics.md); results use its
key names. Timestamps are taken with time.perf_counter when the raw bytes arrive, before any JSON
parsing. Failures are counted per level by reason and never stop the sweep.

The HTTP client is an httpx AsyncClient. By default it runs over `HTTP1StreamTransport`, an
httpx transport that decodes a whole network read of chunked SSE at once: httpx's own transport
spends ~10 µs per HTTP chunk in h11 and its pool scans every connection on each request, which at
1024 streams makes the client, not the engine, the bottleneck (bench/loadgen_capacity.py).

Library use (the Celery task):
    results = run_sweep(SweepConfig(client=ClientConfig(base_url, model), concurrencies=(32, 64),
                                    input_len=1024, output_len=1024),
                        on_progress=..., should_stop=...)
CLI:
    python -m workers.loadgen --base-url URL --model NAME --concurrency 32,64,128 ...
"""

import argparse
import asyncio
import base64
import contextlib
import json
import math
import os
import ssl
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import numpy as np

from reports.failures import describe_failure
from workers import latency_stats, vocabulary

ENDPOINT_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
TRANSPORTS = ("fast", "httpx")
# With no --prompts-per-level, each level sends this many requests per concurrent stream, so the
# steady state outweighs the ramp-up and drain at the level's edges.
DEFAULT_PROMPTS_PER_STREAM = 4
# Common one-token English words for chat prompts; with no tokenizer, one word ≈ one token.
# fmt: off
CHAT_WORDS = (
    "the", "of", "and", "to", "in", "is", "it", "you", "that", "he", "was", "for", "on", "are",
    "as", "with", "his", "they", "at", "be", "this", "have", "from", "or", "one", "had", "by",
    "word", "but", "not", "what", "all", "were", "we", "when", "your", "can", "said", "there",
    "use", "an", "each", "which", "she", "do", "how", "their", "if", "will", "up", "other",
    "about", "out", "many", "then", "them", "these", "so", "some", "her", "would", "make", "like",
    "him", "into", "time", "has", "look", "two", "more", "write", "go", "see", "number", "no",
    "way", "could", "people", "my", "than",
)
# fmt: on

# The longest server error message kept per failure reason.
ERROR_MESSAGE_CHARS = 500

OnRequestDone = Callable[[int, int], None]
ShouldStop = Callable[[], bool]


@dataclass(frozen=True)
class ClientConfig:
    """Where and how to send requests.

    endpoint is "completions" (prompts as token-id lists, exact lengths) or "chat" (text
    prompts, approximate lengths); timeout_s bounds each request end to end and each wait for
    bytes (s); vocab_size is the model's vocabulary (workers.vocabulary), from which prompt
    token ids are drawn, needed by the completions endpoint; transport is "fast"
    (HTTP1StreamTransport) or "httpx" (httpx's own pool).
    """

    base_url: str
    model: str
    endpoint: str = "completions"
    timeout_s: float = 600.0
    vocab_size: int | None = None
    seed: int = 0
    api_key: str | None = None
    transport: str = "fast"


@dataclass(frozen=True)
class LevelConfig:
    """One concurrency level.

    request_rate is the Poisson arrival rate in req/s, None for "send whenever a stream is
    free"; processes > 1 splits the level's streams over that many client processes; the slo_*
    values (ms) turn on request_goodput; index seeds the prompts so each level differs.
    """

    concurrency: int
    input_len: int
    output_len: int
    num_prompts: int
    warmup: int = 0
    request_rate: float | None = None
    processes: int = 1
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    slo_e2el_ms: float | None = None
    index: int = 0


@dataclass(frozen=True)
class SweepConfig:
    """A sweep: one LevelConfig per concurrency, the rest shared.

    prompts_per_level None means DEFAULT_PROMPTS_PER_STREAM × concurrency.
    """

    client: ClientConfig
    concurrencies: tuple[int, ...]
    input_len: int
    output_len: int
    prompts_per_level: int | None = None
    warmup: int = 0
    request_rate: float | None = None
    processes: int = 1
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    slo_e2el_ms: float | None = None

    def levels(self) -> list[LevelConfig]:
        """The sweep's levels in order."""
        return [
            LevelConfig(
                concurrency=c,
                input_len=self.input_len,
                output_len=self.output_len,
                num_prompts=self.prompts_per_level or DEFAULT_PROMPTS_PER_STREAM * c,
                warmup=self.warmup,
                request_rate=self.request_rate,
                processes=self.processes,
                slo_ttft_ms=self.slo_ttft_ms,
                slo_tpot_ms=self.slo_tpot_ms,
                slo_e2el_ms=self.slo_e2el_ms,
                index=i,
            )
            for i, c in enumerate(self.concurrencies)
        ]


@dataclass
class RequestRecord:
    """What one request did, in time.perf_counter seconds (one clock for all processes).

    chunk_ts holds the arrival time of each chunk with non-empty content; prompt_tokens and
    completion_tokens come from the server's usage (None when it sent none); error is the
    failure reason (None on success) and detail a short message for it.
    """

    send_ts: float
    end_ts: float = 0.0
    chunk_ts: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error: str | None = None
    detail: str | None = None

    def to_wire(self) -> dict:
        """JSON-ready form for passing between processes (chunk_ts as base64 float64)."""
        out = asdict(self)
        out["chunk_ts"] = base64.b64encode(np.asarray(self.chunk_ts, np.float64)).decode()
        return out

    @classmethod
    def from_wire(cls, data: dict) -> "RequestRecord":
        """Inverse of to_wire."""
        ts = np.frombuffer(base64.b64decode(data["chunk_ts"]), dtype=np.float64)
        return cls(**{**data, "chunk_ts": ts.tolist()})


class _StreamFailure(Exception):
    def __init__(self, reason: str, detail: str = ""):
        super().__init__(reason)
        self.reason = reason
        self.detail = detail


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


# ---------------------------------------------------------------------------------------------
# Prompts and one request
# ---------------------------------------------------------------------------------------------


def token_id_range(vocab_size: int) -> tuple[int, int]:
    """Half-open range of token ids to draw prompts from.

    Skips the lowest ids (byte and control tokens) and the top 20% where tokenizers keep their
    special and added tokens (Llama 3 from 128000 of 128256, DeepSeek-V3 from 128000 of 129280,
    Qwen from 151643 of 151936, Kimi K2 from 163584 of 163840).
    """
    low = min(1000, vocab_size // 10)
    return low, max(low + 1, int(vocab_size * 0.8))


def build_payload(client_cfg: ClientConfig, level: LevelConfig, key: tuple[int, ...]) -> bytes:
    """The JSON body of one request; key seeds its prompt so every request's prompt differs."""
    rng = np.random.default_rng((client_cfg.seed, level.index, *key))
    body: dict = {
        "model": client_cfg.model,
        "max_tokens": level.output_len,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if client_cfg.endpoint == "chat":
        words = rng.choice(len(CHAT_WORDS), size=level.input_len)
        text = " ".join(CHAT_WORDS[w] for w in words)
        body["messages"] = [{"role": "user", "content": text}]
        body["max_completion_tokens"] = level.output_len
    else:
        if client_cfg.vocab_size is None:
            raise ValueError("prompts of token ids need the model's vocabulary size")
        low, high = token_id_range(client_cfg.vocab_size)
        body["prompt"] = rng.integers(low, high, size=level.input_len).tolist()
    return json.dumps(body, separators=(",", ":")).encode()


def _data_of(event: bytes) -> bytes | None:
    """The data field of one SSE event (several data lines joined), None when it has none."""
    lines = [line for line in event.split(b"\n") if line.startswith(b"data:")]
    if not lines:
        return None
    return b"\n".join(line[6:] if line[5:6] == b" " else line[5:] for line in lines)


class _SSEParser:
    """Splits raw SSE bytes into events and notes content chunks and usage on a record."""

    __slots__ = ("record", "tail", "done")

    def __init__(self, record: RequestRecord):
        self.record = record
        self.tail = b""
        self.done = False

    def feed(self, data: bytes, ts: float) -> None:
        """Parse data that arrived at ts (perf_counter s); raises _StreamFailure on garbage."""
        buf = self.tail + data if self.tail else data
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        events = buf.split(b"\n\n")
        self.tail = events.pop()
        record = self.record
        for event in events:
            if event.startswith(b"data: ") and b"\n" not in event:
                payload = event[6:]
            else:
                payload = _data_of(event)
                if payload is None:
                    continue
            if payload == b"[DONE]":
                self.done = True
                continue
            try:
                obj = json.loads(payload)
            except ValueError:
                raise _StreamFailure("garbage_sse", repr(payload[:80])) from None
            if not isinstance(obj, dict):
                raise _StreamFailure("garbage_sse", repr(payload[:80]))
            choices = obj.get("choices")
            if choices:
                choice = choices[0]
                if not isinstance(choice, dict):
                    raise _StreamFailure("garbage_sse", repr(payload[:80]))
                delta = choice.get("delta")
                if delta is not None:
                    if (
                        delta.get("content")
                        or delta.get("reasoning_content")
                        or (delta.get("reasoning"))
                    ):
                        record.chunk_ts.append(ts)
                elif choice.get("text"):
                    record.chunk_ts.append(ts)
            elif obj.get("error") is not None:
                raise _StreamFailure("stream_error", _error_event_message(obj["error"]))
            usage = obj.get("usage")
            if usage:
                record.prompt_tokens = usage.get("prompt_tokens")
                record.completion_tokens = usage.get("completion_tokens")


def _error_event_message(error) -> str:
    """The message of an error event in a stream (vLLM streams a refused prompt as one)."""
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])[:ERROR_MESSAGE_CHARS]
    return str(error)[:ERROR_MESSAGE_CHARS]


def server_error_message(body: bytes, reason_phrase: str) -> str:
    """The engine's own words for a refused request: the message of its OpenAI-style error
    body ({"error": {"message"}}, or vLLM's and SGLang's {"object": "error", "message"}).
    Any other answer is not an engine's (a proxy, another service at the endpoint's address):
    only its status line's reason phrase is kept, never its body."""
    try:
        obj = json.loads(body)
    except ValueError:
        obj = None
    if isinstance(obj, dict):
        error = obj.get("error")
        if isinstance(error, dict):
            message = error.get("message")
        else:
            message = obj.get("message") if obj.get("object") == "error" else None
        if isinstance(message, str) and message:
            return message[:ERROR_MESSAGE_CHARS]
    return reason_phrase


async def send_request(
    client: httpx.AsyncClient, url: str, body: bytes, headers: dict, timeout_s: float
) -> RequestRecord:
    """Send one streamed request and time it; never raises for a failed request.

    Returns a RequestRecord whose error is one of: http_<status>, timeout, connect_error,
    connection_closed (no response), stream_dropped (body cut before [DONE]), garbage_sse,
    stream_error (an error event in the stream), missing_done, empty_stream, client_error.
    """
    record = RequestRecord(send_ts=time.perf_counter())
    parser = _SSEParser(record)
    in_body = False
    try:
        async with (
            asyncio.timeout(timeout_s),
            client.stream("POST", url, content=body, headers=headers) as response,
        ):
            in_body = True
            if response.status_code != 200:
                message = server_error_message(await response.aread(), response.reason_phrase)
                raise _StreamFailure(f"http_{response.status_code}", message)
            async for data in response.aiter_raw():
                parser.feed(data, time.perf_counter())
        if not parser.done:
            raise _StreamFailure("missing_done", "the stream ended without data: [DONE]")
        if not record.chunk_ts:
            raise _StreamFailure("empty_stream", "no chunk with content before [DONE]")
    except _StreamFailure as exc:
        record.error, record.detail = exc.reason, exc.detail
    except (TimeoutError, httpx.TimeoutException) as exc:
        record.error, record.detail = "timeout", str(exc) or f"no answer within {timeout_s} s"
    except httpx.ConnectError as exc:
        record.error, record.detail = "connect_error", str(exc)
    except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
        # A cut after [DONE] lost nothing the metrics need.
        if not (parser.done and record.chunk_ts):
            record.error = "stream_dropped" if in_body else "connection_closed"
            record.detail = str(exc)
    except Exception as exc:
        # Anything else is still one failed request, never the end of the sweep.
        record.error, record.detail = "client_error", f"{type(exc).__name__}: {exc}"
    record.end_ts = time.perf_counter()
    return record


# ---------------------------------------------------------------------------------------------
# Driving a level in one process
# ---------------------------------------------------------------------------------------------


def _request_headers(client_cfg: ClientConfig) -> dict:
    # identity: the timestamps and the SSE parser read raw bytes, never a compressed body.
    headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
    if client_cfg.api_key:
        headers["Authorization"] = f"Bearer {client_cfg.api_key}"
    return headers


async def _drive(
    client_cfg: ClientConfig,
    level: LevelConfig,
    indices: list[int],
    *,
    concurrency: int,
    warmup: int,
    request_rate: float | None,
    arrival_seed: tuple[int, ...],
    on_record: Callable[[RequestRecord], None],
    should_stop: ShouldStop,
) -> int:
    """Send warmup requests, then one request per index with at most concurrency in flight.

    Returns how many measured requests were sent (fewer than len(indices) after a stop).
    """
    url = client_cfg.base_url.rstrip("/") + ENDPOINT_PATHS[client_cfg.endpoint]
    headers = _request_headers(client_cfg)
    async with make_client(client_cfg) as client:

        async def run_all(keys: list[tuple[int, ...]], report, offsets) -> int:
            position = 0
            sent = 0
            start = time.perf_counter()

            async def stream_worker() -> None:
                nonlocal position, sent
                while position < len(keys) and not should_stop():
                    mine = position
                    position += 1
                    if offsets is not None:
                        delay = start + offsets[mine] - time.perf_counter()
                        if delay > 0:
                            await asyncio.sleep(delay)
                            if should_stop():
                                return
                    body = build_payload(client_cfg, level, keys[mine])
                    sent += 1
                    report(await send_request(client, url, body, headers, client_cfg.timeout_s))

            workers = min(concurrency, len(keys))
            await asyncio.gather(*(stream_worker() for _ in range(workers)))
            return sent

        if warmup:
            await run_all([(1, j) for j in range(warmup)], lambda record: None, None)
        offsets = None
        if request_rate:
            rng = np.random.default_rng((client_cfg.seed, level.index, *arrival_seed))
            gaps = rng.exponential(1.0 / request_rate, size=len(indices))
            offsets = np.cumsum(gaps) - gaps[0]
        return await run_all([(0, i) for i in indices], on_record, offsets)


async def _run_in_process(
    client_cfg: ClientConfig,
    level: LevelConfig,
    on_request_done: OnRequestDone | None,
    should_stop: ShouldStop,
) -> tuple[list[RequestRecord], bool]:
    records: list[RequestRecord] = []

    def on_record(record: RequestRecord) -> None:
        records.append(record)
        if on_request_done is not None:
            on_request_done(len(records), level.num_prompts)

    sent = await _drive(
        client_cfg,
        level,
        list(range(level.num_prompts)),
        concurrency=level.concurrency,
        warmup=level.warmup,
        request_rate=level.request_rate,
        arrival_seed=(0,),
        on_record=on_record,
        should_stop=should_stop,
    )
    return records, sent < level.num_prompts


# ---------------------------------------------------------------------------------------------
# Driving a level over several processes
# ---------------------------------------------------------------------------------------------


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if k < total % parts else 0) for k in range(parts)]


def _shard_specs(client_cfg: ClientConfig, level: LevelConfig) -> list[dict]:
    """One spec per process: its share of streams, prompts, warmup and arrival rate."""
    parts = max(1, min(level.processes, level.concurrency))
    streams = _split(level.concurrency, parts)
    warmups = _split(level.warmup, parts)
    return [
        {
            "client": asdict(client_cfg),
            "level": asdict(level),
            "indices": list(range(k, level.num_prompts, parts)),
            "concurrency": streams[k],
            "warmup": warmups[k],
            # A sum of independent Poisson streams is a Poisson stream of the summed rate.
            "request_rate": level.request_rate * streams[k] / level.concurrency
            if level.request_rate
            else None,
            "shard": k,
        }
        for k in range(parts)
    ]


def _child_env() -> dict:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else root
    return env


async def _run_in_processes(
    client_cfg: ClientConfig,
    level: LevelConfig,
    on_request_done: OnRequestDone | None,
    should_stop: ShouldStop,
) -> tuple[list[RequestRecord], bool, float]:
    """Run the level in subprocesses (not multiprocessing: Celery's pool workers are daemonic
    and may not fork children of their own); merge their raw records."""
    specs = _shard_specs(client_cfg, level)
    records: list[RequestRecord] = []
    stopped = False
    children = []
    for spec in specs:
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "workers.loadgen",
            "--shard",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=_child_env(),
            limit=1 << 26,
        )
        child.stdin.write(json.dumps(spec).encode() + b"\n")
        await child.stdin.drain()
        children.append(child)

    finals: list[dict | None] = [None] * len(children)
    received = [0] * len(children)

    async def collect(k: int) -> None:
        async for line in children[k].stdout:
            message = json.loads(line)
            if "record" in message:
                records.append(RequestRecord.from_wire(message["record"]))
                received[k] += 1
                if on_request_done is not None:
                    on_request_done(len(records), level.num_prompts)
            else:
                finals[k] = message
        await children[k].wait()

    async def watch_stop() -> None:
        nonlocal stopped
        while not stopped:
            await asyncio.sleep(0.1)
            if should_stop():
                stopped = True
                for child in children:
                    # A child that just exited has closed its end of the pipe.
                    with contextlib.suppress(ConnectionError):
                        if child.returncode is None:
                            child.stdin.write(b"stop\n")

    watcher = asyncio.create_task(watch_stop())
    try:
        await asyncio.gather(*(collect(k) for k in range(len(children))))
    finally:
        watcher.cancel()
        for child in children:
            if child.returncode is None:
                child.kill()
                await child.wait()
    cpu_s = 0.0
    for k, final in enumerate(finals):
        if final is None:
            # A shard that died unreported: its missing requests are failures of the client.
            detail = f"client process {k} exited with {children[k].returncode}"
            records.extend(
                RequestRecord(math.nan, math.nan, error="loadgen_shard_failed", detail=detail)
                for _ in range(len(specs[k]["indices"]) - received[k])
            )
        else:
            cpu_s += final["cpu_s"]
            stopped = stopped or final["sent"] < len(specs[k]["indices"])
    return records, stopped, cpu_s


async def _shard_main() -> None:
    """Child side of _run_in_processes: spec on stdin, one JSON line per record on stdout."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 26)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    spec = json.loads(await reader.readline())
    stop = False

    async def watch_stdin() -> None:
        nonlocal stop
        line = await reader.readline()
        stop = stop or line.strip() == b"stop" or not line

    watcher = asyncio.create_task(watch_stdin())
    out = sys.stdout.buffer

    def on_record(record: RequestRecord) -> None:
        out.write(json.dumps({"record": record.to_wire()}).encode() + b"\n")
        out.flush()

    cpu0 = time.process_time()
    sent = await _drive(
        ClientConfig(**spec["client"]),
        LevelConfig(**spec["level"]),
        spec["indices"],
        concurrency=spec["concurrency"],
        warmup=spec["warmup"],
        request_rate=spec["request_rate"],
        arrival_seed=(spec["shard"],),
        on_record=on_record,
        should_stop=lambda: stop,
    )
    watcher.cancel()
    out.write(json.dumps({"sent": sent, "cpu_s": time.process_time() - cpu0}).encode() + b"\n")
    out.flush()


# ---------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------


def summarize_level(records: list[RequestRecord], level: LevelConfig) -> dict:
    """Level metrics from raw records, with `vllm bench serve` key names.

    Durations in s, latencies in ms, throughput in req/s and tok/s. Token totals and the
    token-based figures (throughputs, TPOT, peak tok/s) are None unless every completed request
    reported usage; usage_reported says which case this is.
    """
    ok = [r for r in records if r.error is None]
    failed = [r for r in records if r.error is not None]
    timed = [r for r in records if not math.isnan(r.send_ts)]
    start = min((r.send_ts for r in timed), default=0.0)
    duration = max((r.end_ts for r in timed), default=start) - start
    usage_reported = bool(ok) and all(
        r.completion_tokens is not None and r.prompt_tokens is not None for r in ok
    )
    ttfts = [r.chunk_ts[0] - r.send_ts for r in ok]
    e2els = [r.chunk_ts[-1] - r.send_ts for r in ok]
    itls = [b - a for r in ok for a, b in zip(r.chunk_ts, r.chunk_ts[1:], strict=False)]
    tpots: list[float] = []
    if usage_reported:
        tpots = [
            (r.chunk_ts[-1] - r.chunk_ts[0]) / (r.completion_tokens - 1)
            for r in ok
            if r.completion_tokens > 1
        ]
        total_input = sum(r.prompt_tokens for r in ok)
        total_output = sum(r.completion_tokens for r in ok)
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: None)
    result: dict = {
        "concurrency": level.concurrency,
        "request_rate": level.request_rate,
        "input_len": level.input_len,
        "output_len": level.output_len,
        "num_prompts": level.num_prompts,
        "warmup": level.warmup,
        "duration": duration,
        "completed": len(ok),
        "failed": len(failed),
        "errors": dict(Counter(r.error for r in failed)),
        "error_samples": {r.error: r.detail for r in reversed(failed)},
        "all_failed_with": all_failed_with(records),
        "usage_reported": usage_reported,
        "total_input_tokens": total_input if usage_reported else None,
        "total_output_tokens": total_output if usage_reported else None,
        "content_chunks": sum(len(r.chunk_ts) for r in ok),
        "request_throughput": per_s(len(ok)),
        "output_throughput": per_s(total_output) if usage_reported else None,
        "total_token_throughput": per_s(total_input + total_output) if usage_reported else None,
        "max_output_tokens_per_s": _peak_tokens_per_s(ok, start) if usage_reported else None,
        "max_concurrent_requests": latency_stats.interval_overlap_max(
            np.array([r.send_ts for r in timed]), np.array([r.end_ts for r in timed]), start
        ),
    }
    slos = {"ttft": level.slo_ttft_ms, "tpot": level.slo_tpot_ms, "e2el": level.slo_e2el_ms}
    if any(v is not None for v in slos.values()):
        result["request_goodput"] = per_s(_good_requests(ok, slos, usage_reported))
    result.update(latency_stats.describe_ms("ttft", ttfts))
    result.update(latency_stats.describe_ms("tpot", tpots))
    result.update(latency_stats.describe_ms("itl", itls))
    result.update(latency_stats.describe_ms("e2el", e2els))
    return result


def all_failed_with(records: list[RequestRecord]) -> str | None:
    """ "HTTP 400: <the engine's message>" when every request failed for one reason, else
    None: then the level measured nothing but that error. The message is the one most requests
    got (they may differ in a number, e.g. which token id was out of vocabulary)."""
    if not records or any(r.error is None for r in records):
        return None
    if len({r.error for r in records}) != 1:
        return None
    detail, _ = Counter(r.detail for r in records).most_common(1)[0]
    return describe_failure(records[0].error, detail)


def _peak_tokens_per_s(ok: list[RequestRecord], start: float) -> float:
    """Most output tokens in one 1 s bucket; a chunk counts for its request's tokens / chunks,
    so multi-token chunks (speculative decoding, stream intervals) are not undercounted."""
    times = np.concatenate([np.asarray(r.chunk_ts) for r in ok]) if ok else np.empty(0)
    weights = (
        np.concatenate(
            [np.full(len(r.chunk_ts), r.completion_tokens / len(r.chunk_ts)) for r in ok]
        )
        if ok
        else np.empty(0)
    )
    return latency_stats.bucket_max(times, weights, start)


def _good_requests(ok: list[RequestRecord], slos: dict, usage_reported: bool) -> int:
    """Completed requests within every given SLO (ms); a TPOT SLO needs usage to judge."""
    good = 0
    for r in ok:
        ttft_ms = (r.chunk_ts[0] - r.send_ts) * 1000
        e2el_ms = (r.chunk_ts[-1] - r.send_ts) * 1000
        if slos["ttft"] is not None and ttft_ms > slos["ttft"]:
            continue
        if slos["e2el"] is not None and e2el_ms > slos["e2el"]:
            continue
        if slos["tpot"] is not None:
            if not usage_reported:
                continue
            tokens = r.completion_tokens
            tpot_ms = (e2el_ms - ttft_ms) / (tokens - 1) if tokens > 1 else 0.0
            if tpot_ms > slos["tpot"]:
                continue
        good += 1
    return good


# ---------------------------------------------------------------------------------------------
# Public entry points
# ---------------------------------------------------------------------------------------------


async def run_level(
    client_cfg: ClientConfig,
    level_cfg: LevelConfig,
    *,
    on_request_done: OnRequestDone | None = None,
    should_stop: ShouldStop | None = None,
) -> dict:
    """Run one level and return its metrics (summarize_level's dict) plus bookkeeping.

    on_request_done(done, total) is called after each measured request; should_stop() is
    polled before each new request: once true, no request starts, those in flight finish and
    the result carries stopped=True. Adds started_at / finished_at (UTC epoch s), client_cpu_s
    (CPU s the client processes used) and processes.
    """
    if client_cfg.endpoint not in ENDPOINT_PATHS:
        raise ValueError(f"endpoint must be one of {sorted(ENDPOINT_PATHS)}")
    if client_cfg.endpoint == "completions" and client_cfg.vocab_size is None:
        raise ValueError("prompts of token ids need the model's vocabulary size")
    if client_cfg.transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {TRANSPORTS}")
    stop = should_stop or (lambda: False)
    started_at = time.time()
    cpu0 = time.process_time()
    if level_cfg.processes > 1:
        records, stopped, child_cpu = await _run_in_processes(
            client_cfg, level_cfg, on_request_done, stop
        )
    else:
        records, stopped = await _run_in_process(client_cfg, level_cfg, on_request_done, stop)
        child_cpu = 0.0
    result = summarize_level(records, level_cfg)
    result.update(
        started_at=started_at,
        finished_at=time.time(),
        client_cpu_s=time.process_time() - cpu0 + child_cpu,
        processes=max(1, min(level_cfg.processes, level_cfg.concurrency)),
        stopped=stopped,
    )
    return result


def run_sweep(
    cfg: SweepConfig,
    *,
    on_level_start: Callable[[int, LevelConfig], None] | None = None,
    on_level_done: Callable[[int, dict], None] | None = None,
    on_progress: Callable[[int, int, int], None] | None = None,
    should_stop: ShouldStop | None = None,
) -> list[dict]:
    """Run every level of the sweep in order; returns the finished levels' results.

    on_level_start(i, level) and on_level_done(i, result) bracket level i;
    on_progress(i, done, total) follows requests within it. When should_stop() turns true the
    level in progress ends at the next request boundary and is not returned; finished levels
    are. Blocking: runs its own event loop.
    """
    stop = should_stop or (lambda: False)

    async def sweep() -> list[dict]:
        results = []
        for i, level in enumerate(cfg.levels()):
            if stop():
                break
            if on_level_start is not None:
                on_level_start(i, level)
            progress = None
            if on_progress is not None:

                def progress(done: int, total: int, i: int = i) -> None:
                    on_progress(i, done, total)

            result = await run_level(cfg.client, level, on_request_done=progress, should_stop=stop)
            if result["stopped"]:
                break
            results.append(result)
            if on_level_done is not None:
                on_level_done(i, result)
        return results

    return asyncio.run(sweep())


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------

# (title, result key, width, decimals) of the CLI's table.
TABLE_COLUMNS = (
    ("conc", "concurrency", 5, 0),
    ("ok", "completed", 6, 0),
    ("fail", "failed", 5, 0),
    ("dur s", "duration", 7, 1),
    ("req/s", "request_throughput", 7, 2),
    ("out tok/s", "output_throughput", 10, 1),
    ("peak tok/s", "max_output_tokens_per_s", 10, 1),
    ("TTFT ms", "mean_ttft_ms", 9, 1),
    ("p99 TTFT", "p99_ttft_ms", 9, 1),
    ("TPOT ms", "mean_tpot_ms", 8, 2),
    ("p99 TPOT", "p99_tpot_ms", 8, 2),
    ("ITL ms", "mean_itl_ms", 8, 2),
    ("p99 ITL", "p99_itl_ms", 8, 2),
)


def format_level(result: dict, header: bool) -> str:
    """One table row for a level result (and the header line above it when header is true).

    A level whose every request failed with one error shows that error, verbatim, first."""
    cells = []
    for _, key, width, decimals in TABLE_COLUMNS:
        value = result.get(key)
        cells.append("-".rjust(width) if value is None else f"{value:>{width}.{decimals}f}")
    row = " ".join(cells)
    if result.get("all_failed_with"):
        total = result.get("failed")
        row = (
            f"{result.get('concurrency')!s:>5} every request failed ({total} of {total}): "
            f"{result['all_failed_with']}"
        )
    else:
        if result.get("errors"):
            row += "  " + ", ".join(f"{k}={v}" for k, v in sorted(result["errors"].items()))
        if not result.get("usage_reported"):
            row += "  (no usage from the server: token figures left out)"
    if not header:
        return row
    titles = " ".join(title.rjust(width) for title, _, width, _ in TABLE_COLUMNS)
    return titles + "\n" + row


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m workers.loadgen", description="Concurrency sweep of an OpenAI endpoint."
    )
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--endpoint", choices=sorted(ENDPOINT_PATHS), default="completions")
    parser.add_argument("--concurrency", required=True, help="comma-separated, e.g. 32,64,128")
    parser.add_argument("--input-len", type=int, default=1024)
    parser.add_argument("--output-len", type=int, default=1024)
    parser.add_argument("--prompts-per-level", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=0)
    parser.add_argument("--request-rate", type=float, default=None, help="req/s, Poisson")
    parser.add_argument(
        "--tokenizer",
        default=None,
        help="the model's tokenizer.json or folder: prompt token ids are drawn from its vocabulary",
    )
    parser.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help="the model's vocabulary size, when no --tokenizer is at hand",
    )
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=600.0, help="per request, s")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"))
    parser.add_argument("--transport", choices=TRANSPORTS, default="fast")
    parser.add_argument("--slo-ttft-ms", type=float, default=None)
    parser.add_argument("--slo-tpot-ms", type=float, default=None)
    parser.add_argument("--slo-e2el-ms", type=float, default=None)
    parser.add_argument("--output", default=None, help="write the JSON list of levels here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; prints one table row per level, returns the exit status."""
    args = _parse_args(argv)
    vocab_size = None
    if args.endpoint == "completions":
        try:
            vocab_size, source = vocabulary.resolve(
                vocab_size=args.vocab_size,
                tokenizer=args.tokenizer,
                base_url=args.base_url,
                model=args.model,
            )
        except vocabulary.VocabularyUnknown as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        # on stderr: stdout is the table, for pipes
        print(
            f"prompt token ids drawn from a vocabulary of {vocab_size:,} ({source})",
            file=sys.stderr,
        )
    cfg = SweepConfig(
        client=ClientConfig(
            base_url=args.base_url,
            model=args.model,
            endpoint=args.endpoint,
            timeout_s=args.timeout,
            vocab_size=vocab_size,
            seed=args.seed,
            api_key=args.api_key,
            transport=args.transport,
        ),
        concurrencies=tuple(int(c) for c in args.concurrency.split(",") if c.strip()),
        input_len=args.input_len,
        output_len=args.output_len,
        prompts_per_level=args.prompts_per_level,
        warmup=args.warmup,
        request_rate=args.request_rate,
        processes=args.processes,
        slo_ttft_ms=args.slo_ttft_ms,
        slo_tpot_ms=args.slo_tpot_ms,
        slo_e2el_ms=args.slo_e2el_ms,
    )

    def on_level_done(i: int, result: dict) -> None:
        print(format_level(result, header=i == 0), flush=True)

    results = run_sweep(cfg, on_level_done=on_level_done)
    if args.output:
        Path(args.output).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--shard"]:
        asyncio.run(_shard_main())
    else:
        sys.exit(main())
