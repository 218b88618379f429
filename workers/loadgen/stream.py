"""One request: its body (the prompt from workers.loadgen.prompts), its streamed answer read
as server-sent events with a timestamp per content chunk, and what the server said when it
failed."""

from __future__ import annotations

import asyncio
import json
import time

import httpx

from workers.loadgen.config import ERROR_MESSAGE_CHARS, ClientConfig, LevelConfig, RequestRecord
from workers.loadgen.prompts import request_prompt


class StreamFailure(Exception):
    def __init__(self, reason: str, detail: str = ""):
        super().__init__(reason)
        self.reason = reason
        self.detail = detail


# ---------------------------------------------------------------------------------------------
# Prompts and one request
# ---------------------------------------------------------------------------------------------


def build_payload(
    client_cfg: ClientConfig,
    level: LevelConfig,
    key: tuple[int, ...],
    *,
    messages: list[dict] | None = None,
    output_len: int | None = None,
) -> bytes:
    """The JSON body of one request; key seeds its prompt so every request's prompt differs
    (workers.loadgen.prompts). messages and output_len: a multi-turn conversation's turn, sent
    as given."""
    if messages is None:
        prompt, output_len = request_prompt(client_cfg, level, key)
    else:
        prompt = messages
    body: dict = {
        "model": client_cfg.model,
        "max_tokens": output_len,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if client_cfg.endpoint == "chat":
        body["messages"] = prompt
        body["max_completion_tokens"] = output_len
    else:
        body["prompt"] = prompt
    return json.dumps(body, separators=(",", ":")).encode()


def _data_of(event: bytes) -> bytes | None:
    """The data field of one SSE event (several data lines joined), None when it has none."""
    lines = [line for line in event.split(b"\n") if line.startswith(b"data:")]
    if not lines:
        return None
    return b"\n".join(line[6:] if line[5:6] == b" " else line[5:] for line in lines)


class _SSEParser:
    """Splits raw SSE bytes into events and notes content chunks and usage on a record."""

    __slots__ = ("record", "tail", "done", "answer")

    def __init__(self, record: RequestRecord, answer: list[str] | None = None):
        self.record = record
        self.tail = b""
        self.done = False
        # the answer's text pieces, kept only where the next turn sends them back
        self.answer = answer

    def feed(self, data: bytes, ts: float) -> None:
        """Parse data that arrived at ts (perf_counter s); raises StreamFailure on garbage."""
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
                raise StreamFailure("garbage_sse", repr(payload[:80])) from None
            if not isinstance(obj, dict):
                raise StreamFailure("garbage_sse", repr(payload[:80]))
            choices = obj.get("choices")
            if choices:
                choice = choices[0]
                if not isinstance(choice, dict):
                    raise StreamFailure("garbage_sse", repr(payload[:80]))
                self._note_choice(choice, ts)
            elif obj.get("error") is not None:
                raise StreamFailure("stream_error", _error_event_message(obj["error"]))
            usage = obj.get("usage")
            if usage:
                record.prompt_tokens = usage.get("prompt_tokens")
                record.completion_tokens = usage.get("completion_tokens")

    def _note_choice(self, choice: dict, ts: float) -> None:
        """A chunk with content (or reasoning) arrived at ts."""
        delta = choice.get("delta")
        if delta is not None:
            if delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning"):
                self.record.chunk_ts.append(ts)
                if self.answer is not None and delta.get("content"):
                    self.answer.append(delta["content"])
        elif choice.get("text"):
            self.record.chunk_ts.append(ts)


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
    client: httpx.AsyncClient,
    url: str,
    body: bytes,
    headers: dict,
    timeout_s: float,
    answer: list[str] | None = None,
) -> RequestRecord:
    """Send one streamed request and time it; never raises for a failed request. answer: a
    list the answer's text pieces are appended to (a multi-turn conversation's history).

    Returns a RequestRecord whose error is one of: http_<status>, timeout, connect_error,
    connection_closed (no response), stream_dropped (body cut before [DONE]), garbage_sse,
    stream_error (an error event in the stream), missing_done, empty_stream, client_error.
    """
    record = RequestRecord(send_ts=time.perf_counter())
    parser = _SSEParser(record, answer)
    in_body = False
    try:
        async with (
            asyncio.timeout(timeout_s),
            client.stream("POST", url, content=body, headers=headers) as response,
        ):
            in_body = True
            if response.status_code != 200:
                message = server_error_message(await response.aread(), response.reason_phrase)
                raise StreamFailure(f"http_{response.status_code}", message)
            async for data in response.aiter_raw():
                parser.feed(data, time.perf_counter())
        if not parser.done:
            raise StreamFailure("missing_done", "the stream ended without data: [DONE]")
        if not record.chunk_ts:
            raise StreamFailure("empty_stream", "no chunk with content before [DONE]")
    except StreamFailure as exc:
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
