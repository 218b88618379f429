"""The stand-in engine: an OpenAI-compatible test double of a continuous-batching engine.

It is never a source of real numbers. It behaves like SGLang/vLLM from the outside so that
sweeps, the demo and the tests run without a GPU: at most max_running_requests decode together,
the rest queue; each decode step takes step_ms_base + step_ms_per_req × batch (or a time derived
from an MoE roofline), so throughput rises with concurrency and plateaus at the cap. It streams
SSE as SGLang and vLLM do, serves /health, /v1/models (owned_by STANDIN_OWNER, by which the
worker tells a stand-in apart), /get_server_info and /metrics with both engines' metric names,
and injects faults on request (HTTP 500s, dropped connections, stalls).

    python -m localstack.standin --port 30000 --model NAME --max-running-requests 64

HTTP/1.1 is served straight from an asyncio.Protocol: one scheduler step writes one event to each
running stream, cheaply enough for thousands of concurrent streams on one core.
"""

import argparse
import asyncio
import contextlib
import json
import random
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from domain.engine import STANDIN_OWNER

# What the tokens say; ids cycle through these words.
TOKEN_WORDS = (
    " the",
    " engine",
    " streams",
    " these",
    " words",
    " as",
    " a",
    " stand-in",
    " for",
    " a",
    " real",
    " model",
    " and",
    " its",
    " tokens",
)
TOKEN_JSON = tuple(json.dumps(w).encode() for w in TOKEN_WORDS)
DEFAULT_MAX_TOKENS = {"completions": 16, "chat": 256}


@dataclass(frozen=True)
class RooflineStepModel:
    """Decode-step time of an MoE model on one rank, from its shape and the GPU's rates.

    Per MoE layer a step moves the weights of the experts the batch touches and does
    2·M·k·3·H·N FLOPs; the layer takes the larger of bytes / HBM bandwidth and FLOPs / matrix
    rate. Sizes are per rank (N, experts_per_rank); rates in bytes/s and FLOP/s.
    """

    num_experts: int
    experts_per_rank: int
    topk: int
    hidden_size: int
    n: int
    num_moe_layers: int
    weight_bytes: float
    hbm_bytes_per_s: float = 4.24e12
    flops_per_s: float = 689e12

    def step_seconds(self, batch: int) -> float:
        """Time of one decode step over batch sequences (s), MoE layers only."""
        touched = self.experts_per_rank * (1 - (1 - self.topk / self.num_experts) ** batch)
        weight_bytes = touched * 3 * self.hidden_size * self.n * self.weight_bytes
        flops = 2 * batch * self.topk * 3 * self.hidden_size * self.n
        per_layer = max(weight_bytes / self.hbm_bytes_per_s, flops / self.flops_per_s)
        return self.num_moe_layers * per_layer


def roofline_from_config(config_path: str, tp: int = 8) -> RooflineStepModel:
    """A RooflineStepModel for a Hugging Face config.json served with tensor parallel tp."""
    # tuning is needed only for --roofline, where the MoE shape is read.
    from tuning.moe_params import moe_params

    params = moe_params(json.loads(Path(config_path).read_text()), tp=tp)
    quant = (params.quantization or "").lower()
    weight_bytes = 0.5 if "fp4" in quant else 1.0 if ("fp8" in quant or "int8" in quant) else 2.0
    return RooflineStepModel(
        num_experts=params.num_experts,
        experts_per_rank=params.experts_per_rank,
        topk=params.topk,
        hidden_size=params.hidden_size,
        n=params.N,
        num_moe_layers=params.num_moe_layers or params.num_layers or 1,
        weight_bytes=weight_bytes,
    )


@dataclass(frozen=True)
class StandinConfig:
    """How the stand-in behaves.

    Step time (ms) = step_ms_base + step_ms_per_req × running, or step_ms_base + the roofline's
    step time when roofline is set; each admitted request adds prefill_ms_per_token × its
    prompt tokens to the step that admits it. max_total_tokens is the KV pool (tokens), default
    8192 per running slot. error_rate / drop_rate are per-request probabilities; stall_ms
    pauses every stream once, before a random chunk.
    """

    model: str = "standin"
    max_running_requests: int = 64
    step_ms_base: float = 8.0
    step_ms_per_req: float = 0.25
    prefill_ms_per_token: float = 0.002
    max_total_tokens: int | None = None
    error_rate: float = 0.0
    drop_rate: float = 0.0
    stall_ms: float = 0.0
    seed: int = 0
    roofline: RooflineStepModel | None = None

    def step_seconds(self, batch: int) -> float:
        """Decode-step time for batch running sequences (s)."""
        if self.roofline is not None:
            return self.step_ms_base / 1000 + self.roofline.step_seconds(batch)
        return (self.step_ms_base + self.step_ms_per_req * batch) / 1000


class _Stream:
    """One generation request: its output budget, SSE framing and fault plan."""

    __slots__ = (
        "conn",
        "chat",
        "stream",
        "prompt_tokens",
        "max_new",
        "generated",
        "include_usage",
        "head",
        "tail",
        "drop_at",
        "stall_at",
        "resume_at",
        "text",
        "rid",
        "created",
        "finish_reason",
    )

    def __init__(self, conn, chat, stream, prompt_tokens, max_new, include_usage, model):
        self.conn = conn
        self.chat = chat
        self.stream = stream
        self.prompt_tokens = prompt_tokens
        self.max_new = max_new
        self.generated = 0
        self.include_usage = include_usage
        self.drop_at = -1
        self.stall_at = -1
        self.resume_at = 0.0
        self.text: list[str] = []
        self.rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.finish_reason = "length"
        obj = "chat.completion.chunk" if chat else "text_completion"
        self.head = (
            f'data: {{"id":"{self.rid}","object":"{obj}","created":{self.created},'
            f'"model":{json.dumps(model)},"choices":[{{"index":0,'
        ).encode() + (b'"delta":{"content":' if chat else b'"text":')
        self.tail = (b"}" if chat else b"") + b',"logprobs":null,"finish_reason":'

    def event(self, token: int, last: bool) -> bytes:
        """One SSE event carrying the token; the last one names the finish reason."""
        finish = b'"%s"' % self.finish_reason.encode() if last else b"null"
        return self.head + TOKEN_JSON[token] + self.tail + finish + b'}],"usage":null}\n\n'

    def usage(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.generated,
            "total_tokens": self.prompt_tokens + self.generated,
        }


def _sse(obj: dict) -> bytes:
    """One SSE event with compact JSON, as the engines' pydantic models dump it."""
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class _Engine:
    """The continuous-batching scheduler: a queue, a running batch capped at the config's
    max_running_requests, and a step loop that emits one token per running stream."""

    def __init__(self, config: StandinConfig):
        self.config = config
        self.max_total_tokens = config.max_total_tokens or 8192 * config.max_running_requests
        self.waiting: deque[_Stream] = deque()
        self.running: list[_Stream] = []
        self.reserved_tokens = 0
        self.generation_tokens_total = 0
        self.prompt_tokens_total = 0
        self.requests_total = 0
        self.rng = random.Random(config.seed)
        self._wake = asyncio.Event()

    def used_tokens(self) -> int:
        return sum(s.prompt_tokens + s.generated for s in self.running)

    def submit(self, stream: _Stream) -> None:
        cfg = self.config
        if cfg.drop_rate and self.rng.random() < cfg.drop_rate:
            stream.drop_at = self.rng.randrange(max(1, stream.max_new))
        if cfg.stall_ms and stream.max_new > 1:
            stream.stall_at = self.rng.randrange(1, stream.max_new)
        self.waiting.append(stream)
        self._wake.set()

    def _admit(self) -> int:
        """Move queued streams into the batch while slots and KV room last; returns the
        prompt tokens admitted (their prefill cost lands on this step)."""
        cap = self.config.max_running_requests
        prefill = 0
        while self.waiting and len(self.running) < cap:
            stream = self.waiting[0]
            need = stream.prompt_tokens + stream.max_new
            if self.running and self.reserved_tokens + need > self.max_total_tokens:
                break
            self.waiting.popleft()
            if stream.conn.closed:
                continue
            self.running.append(stream)
            self.reserved_tokens += need
            self.prompt_tokens_total += stream.prompt_tokens
            prefill += stream.prompt_tokens
        return prefill

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        while True:
            prefill_tokens = self._admit()
            if not self.running:
                self._wake.clear()
                await self._wake.wait()
                deadline = loop.time()
                continue
            step = self.config.step_seconds(len(self.running))
            step += self.config.prefill_ms_per_token * prefill_tokens / 1000
            deadline += step
            delay = deadline - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                # Behind schedule (CPU-bound): let I/O in and restart the clock.
                deadline = loop.time()
                await asyncio.sleep(0)
            self._step(loop.time())

    def _step(self, now: float) -> None:
        still = []
        for s in self.running:
            if s.conn.closed:
                self._release(s)
                continue
            if s.resume_at > now:
                still.append(s)
                continue
            if s.generated == s.stall_at:
                s.stall_at = -1
                s.resume_at = now + self.config.stall_ms / 1000
                still.append(s)
                continue
            if s.generated == s.drop_at:
                s.conn.drop()
                self._release(s)
                continue
            token = (s.generated + len(s.rid)) % len(TOKEN_WORDS)
            s.generated += 1
            self.generation_tokens_total += 1
            last = s.generated >= s.max_new
            if s.stream:
                s.conn.write_chunk(s.event(token, last))
            else:
                s.text.append(TOKEN_WORDS[token])
            if last:
                self._finish(s)
                self._release(s)
            else:
                still.append(s)
        self.running = still

    def _release(self, s: _Stream) -> None:
        self.reserved_tokens -= s.prompt_tokens + s.max_new

    def _finish(self, s: _Stream) -> None:
        if not s.stream:
            s.conn.finish_json(200, _full_response(s, self.config.model))
            return
        tail = b""
        if s.include_usage:
            usage = {
                "id": s.rid,
                "object": "chat.completion.chunk" if s.chat else "text_completion",
                "created": s.created,
                "model": self.config.model,
                "choices": [],
                "usage": s.usage(),
            }
            tail = _chunk(_sse(usage))
        s.conn.finish_stream(tail + _chunk(b"data: [DONE]\n\n"))


def _full_response(s: _Stream, model: str) -> dict:
    text = "".join(s.text)
    if s.chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}}
    else:
        choice = {"index": 0, "text": text, "logprobs": None}
    choice["finish_reason"] = s.finish_reason
    return {
        "id": s.rid,
        "object": "chat.completion" if s.chat else "text_completion",
        "created": s.created,
        "model": model,
        "choices": [choice],
        "usage": s.usage(),
    }


def _prompt_tokens(body: dict, chat: bool) -> int:
    """Prompt length: exact for token-id prompts, one token per word for text."""
    if chat:
        messages = body.get("messages") or []
        words = sum(len(str(m.get("content", "")).split()) for m in messages if isinstance(m, dict))
        # A chat template adds a few tokens per message.
        return words + 4 * len(messages)
    prompt = body.get("prompt", "")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
        prompt = prompt[0]
    if isinstance(prompt, list):
        return len(prompt)
    return max(1, len(str(prompt).split()))


class _HTTPConnection(asyncio.Protocol):
    """One client connection: parses HTTP/1.1 requests one at a time and answers them."""

    def __init__(self, server: "StandinServer"):
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.busy = False
        self.closed = False
        self.keep_alive = True

    def connection_made(self, transport):
        self.transport = transport
        self.server.connections.add(self)

    def connection_lost(self, exc):
        self.closed = True
        self.server.connections.discard(self)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.busy:
            self._next_request()

    def _next_request(self) -> None:
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buffer) > 65536:
                self.finish_json(431, _error("request head too large", 431))
            return
        lines = bytes(self.buffer[:end]).decode("latin-1").split("\r\n")
        try:
            method, target, version = lines[0].split(" ")
        except ValueError:
            self.keep_alive = False
            self.finish_json(400, _error("malformed request line", 400))
            return
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self.keep_alive = False
            self.finish_json(411, _error("send a Content-Length body", 411))
            return
        try:
            length = int(headers.get("content-length") or 0)
        except ValueError:
            self.keep_alive = False
            self.finish_json(400, _error("malformed Content-Length", 400))
            return
        if len(self.buffer) < end + 4 + length:
            return
        body = bytes(self.buffer[end + 4 : end + 4 + length])
        del self.buffer[: end + 4 + length]
        self.keep_alive = version == "HTTP/1.1" and headers.get("connection", "") != "close"
        self.busy = True
        self.server.dispatch(self, method, target.split("?", 1)[0], body)

    def _head(self, status: int, content_type: str, extra: str) -> bytes:
        return (
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}\r\n"
            f"server: {STANDIN_OWNER}\r\ncontent-type: {content_type}\r\n{extra}"
            f"connection: {'keep-alive' if self.keep_alive else 'close'}\r\n\r\n"
        ).encode()

    def finish_body(self, status: int, content_type: str, body: bytes) -> None:
        """Answer the current request with a complete body."""
        if self.closed:
            return
        self.transport.write(
            self._head(status, content_type, f"content-length: {len(body)}\r\n") + body
        )
        self._done()

    def finish_json(self, status: int, obj: dict) -> None:
        self.finish_body(status, "application/json", json.dumps(obj).encode())

    def start_stream(self) -> None:
        self.transport.write(self._head(200, "text/event-stream", "transfer-encoding: chunked\r\n"))

    def write_chunk(self, event: bytes) -> None:
        self.transport.write(_chunk(event))

    def finish_stream(self, tail: bytes) -> None:
        if not self.closed:
            self.transport.write(tail + b"0\r\n\r\n")
            self._done()

    def drop(self) -> None:
        """Cut the connection mid-stream (the drop fault)."""
        self.closed = True
        self.transport.close()

    def _done(self) -> None:
        self.busy = False
        if not self.keep_alive:
            self.closed = True
            self.transport.close()
        elif self.buffer:
            self._next_request()


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}
_REASONS.update({411: "Length Required", 431: "Request Header Fields Too Large"})
_REASONS[500] = "Internal Server Error"


def _error(message: str, code: int) -> dict:
    """An error body as vLLM and SGLang's OpenAI servers send it."""
    kind = "InternalServerError" if code >= 500 else "BadRequestError"
    return {"object": "error", "message": message, "type": kind, "param": None, "code": code}


class StandinServer:
    """The stand-in's HTTP routes over one _Engine."""

    def __init__(self, config: StandinConfig):
        self.config = config
        self.engine = _Engine(config)
        self.started_at = time.time()
        self.connections: set[_HTTPConnection] = set()
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(self))

    def dispatch(self, conn: _HTTPConnection, method: str, path: str, body: bytes) -> None:
        """Answer one request; generation requests are handed to the engine."""
        if path in ("/v1/completions", "/v1/chat/completions"):
            if method != "POST":
                conn.finish_json(405, _error("use POST", 405))
                return
            self._generate(conn, path.endswith("chat/completions"), body)
        elif method != "GET":
            conn.finish_json(405, _error("use GET", 405))
        elif path in ("/health", "/health_generate"):
            conn.finish_body(200, "text/plain", b"")
        elif path == "/v1/models":
            conn.finish_json(200, self.models())
        elif path in ("/get_server_info", "/server_info"):
            conn.finish_json(200, self.server_info())
        elif path == "/metrics":
            conn.finish_body(200, "text/plain; version=0.0.4", generate_latest(self.registry))
        else:
            conn.finish_json(404, _error(f"no route {path}", 404))

    def models(self) -> dict:
        model = self.config.model
        return {
            "object": "list",
            "data": [
                {
                    "id": model,
                    "object": "model",
                    "created": int(self.started_at),
                    "owned_by": STANDIN_OWNER,
                    "root": model,
                }
            ],
        }

    def server_info(self) -> dict:
        cfg = self.config
        return {
            "engine": STANDIN_OWNER,
            # a test double has no release of its own to report
            "version": None,
            "model_path": cfg.model,
            "served_model_name": cfg.model,
            "max_running_requests": cfg.max_running_requests,
            "max_total_num_tokens": self.engine.max_total_tokens,
            "step_ms_base": cfg.step_ms_base,
            "step_ms_per_req": cfg.step_ms_per_req if cfg.roofline is None else None,
            "roofline": cfg.roofline is not None,
        }

    def _generate(self, conn: _HTTPConnection, chat: bool, raw: bytes) -> None:
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("the body is not a JSON object")
        except ValueError as exc:
            conn.finish_json(400, _error(f"invalid JSON body: {exc}", 400))
            return
        engine = self.engine
        engine.requests_total += 1
        if self.config.error_rate and engine.rng.random() < self.config.error_rate:
            conn.finish_json(500, _error("injected failure (stand-in --error-rate)", 500))
            return
        endpoint = "chat" if chat else "completions"
        max_new = body.get("max_completion_tokens") if chat else None
        max_new = max_new or body.get("max_tokens") or DEFAULT_MAX_TOKENS[endpoint]
        if not isinstance(max_new, int) or max_new < 1:
            conn.finish_json(400, _error("max_tokens must be a positive integer", 400))
            return
        stream = _Stream(
            conn,
            chat,
            bool(body.get("stream")),
            _prompt_tokens(body, chat),
            max_new,
            bool((body.get("stream_options") or {}).get("include_usage")),
            self.config.model,
        )
        if not body.get("ignore_eos"):
            # Without ignore_eos the "model" may stop early at an end-of-sequence token.
            stream.max_new = engine.rng.randint(1, max_new)
            if stream.max_new < max_new:
                stream.finish_reason = "stop"
        if stream.stream:
            conn.start_stream()
            if chat:
                role = {
                    "id": stream.rid,
                    "object": "chat.completion.chunk",
                    "created": stream.created,
                    "model": self.config.model,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ],
                    "usage": None,
                }
                conn.write_chunk(_sse(role))
        engine.submit(stream)


class _EngineCollector:
    """Prometheus collector exposing the engine's state under SGLang's and vLLM's names."""

    def __init__(self, server: StandinServer):
        self.server = server

    def collect(self):
        engine = self.server.engine
        model = self.server.config.model
        running = float(len(engine.running))
        queued = float(len(engine.waiting))
        used = float(engine.used_tokens())
        usage = used / engine.max_total_tokens
        sglang_labels = ["engine_type", "model_name", "pp_rank", "tp_rank"]
        sglang_values = ["unified", model, "0", "0"]
        vllm_labels = ["engine", "model_name"]
        vllm_values = ["0", model]
        gauges = (
            ("sglang:num_running_reqs", "The number of running requests.", running, "s"),
            ("sglang:num_queue_reqs", "The number of requests in the waiting queue.", queued, "s"),
            ("sglang:token_usage", "The token usage.", usage, "s"),
            ("sglang:num_used_tokens", "The number of used tokens.", used, "s"),
            (
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
                running,
                "v",
            ),
            (
                "vllm:num_requests_waiting",
                "Number of requests waiting to be processed.",
                queued,
                "v",
            ),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", usage, "v"),
        )
        for name, doc, value, engine_kind in gauges:
            labels, values = (
                (sglang_labels, sglang_values) if engine_kind == "s" else (vllm_labels, vllm_values)
            )
            family = GaugeMetricFamily(name, doc, labels=labels)
            family.add_metric(values, value)
            yield family
        for name, labels, values in (
            ("sglang:generation_tokens", sglang_labels, sglang_values),
            ("vllm:generation_tokens", vllm_labels, vllm_values),
        ):
            family = CounterMetricFamily(name, "Generation tokens processed.", labels=labels)
            family.add_metric(values, float(engine.generation_tokens_total))
            yield family
        info = GaugeMetricFamily(
            "moeops_standin_info",
            "This engine is the moeops stand-in, a test double.",
            labels=["model_name"],
        )
        info.add_metric([model], 1.0)
        yield info


async def serve(config: StandinConfig, host: str, port: int, ready=None) -> None:
    """Serve until cancelled; ready(bound_port) is called once listening."""
    server = StandinServer(config)
    loop = asyncio.get_running_loop()
    listener = await loop.create_server(
        lambda: _HTTPConnection(server), host, port, backlog=4096, reuse_address=True
    )
    scheduler = asyncio.create_task(server.engine.run())
    if ready is not None:
        ready(listener.sockets[0].getsockname()[1])
    try:
        await listener.serve_forever()
    finally:
        scheduler.cancel()
        listener.close()
        for conn in list(server.connections):
            conn.transport.close()
        await asyncio.gather(scheduler, return_exceptions=True)


def start_standin_in_thread(config: StandinConfig, host: str = "127.0.0.1", port: int = 0):
    """Start a stand-in on its own event loop in a daemon thread.

    Returns (base_url, stop): base_url like "http://127.0.0.1:PORT", stop() shuts it down and
    waits for the thread.
    """
    loop = asyncio.new_event_loop()
    bound = threading.Event()
    state: dict = {}

    def ready(p: int) -> None:
        state["port"] = p
        bound.set()

    def run() -> None:
        asyncio.set_event_loop(loop)
        state["task"] = loop.create_task(serve(config, host, port, ready))
        try:
            loop.run_until_complete(state["task"])
        except (asyncio.CancelledError, Exception) as exc:
            state["error"] = exc
            bound.set()
        finally:
            loop.close()

    thread = threading.Thread(target=run, name="moeops-standin", daemon=True)
    thread.start()
    bound.wait(10)
    if "port" not in state:
        raise RuntimeError(f"the stand-in did not start: {state.get('error')!r}")

    def stop() -> None:
        if not loop.is_closed():
            loop.call_soon_threadsafe(state["task"].cancel)
        thread.join(10)

    return f"http://{host}:{state['port']}", stop


def spawn_standin(args: list[str], host: str = "127.0.0.1") -> tuple[str, subprocess.Popen]:
    """Start `python -m localstack.standin` with args on a free port in a subprocess.

    Returns (base_url, process); the caller terminates the process.
    """
    root = str(Path(__file__).resolve().parents[1])
    proc = subprocess.Popen(
        [sys.executable, "-m", "localstack.standin", "--host", host, "--port", "0", *args],
        stdout=subprocess.PIPE,
        cwd=root,
        text=True,
    )
    line = proc.stdout.readline()
    if not line.startswith("listening on "):
        proc.kill()
        raise RuntimeError(f"the stand-in did not start: {line!r}")
    return line.split()[-1], proc


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m localstack.standin", description="moeops stand-in engine (a test double)."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--model", default="standin")
    parser.add_argument("--max-running-requests", type=int, default=64)
    parser.add_argument("--step-ms-base", type=float, default=8.0)
    parser.add_argument("--step-ms-per-req", type=float, default=0.25)
    parser.add_argument("--prefill-ms-per-token", type=float, default=0.002)
    parser.add_argument("--max-total-tokens", type=int, default=None)
    parser.add_argument("--roofline", default=None, help="HF config.json for a roofline step")
    parser.add_argument("--tp", type=int, default=8, help="tensor parallel size for --roofline")
    parser.add_argument("--error-rate", type=float, default=0.0)
    parser.add_argument("--drop-rate", type=float, default=0.0)
    parser.add_argument("--stall-ms", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--log-line",
        action="append",
        default=[],
        metavar="LINE",
        help="a line to write to stdout once listening, as an engine logs at start-up (e.g. a "
        "vLLM fall-back line, for the engine-paths reader); may be given again",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """CLI entry point: serve until interrupted; prints "listening on URL" once bound."""
    args = _parse_args(argv)
    config = StandinConfig(
        model=args.model,
        max_running_requests=args.max_running_requests,
        step_ms_base=args.step_ms_base,
        step_ms_per_req=args.step_ms_per_req,
        prefill_ms_per_token=args.prefill_ms_per_token,
        max_total_tokens=args.max_total_tokens,
        error_rate=args.error_rate,
        drop_rate=args.drop_rate,
        stall_ms=args.stall_ms,
        seed=args.seed,
        roofline=roofline_from_config(args.roofline, args.tp) if args.roofline else None,
    )

    def ready(port: int) -> None:
        print(f"listening on http://{args.host}:{port}", flush=True)
        for line in args.log_line:
            print(line, flush=True)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(config, args.host, args.port, ready))


if __name__ == "__main__":
    main()
