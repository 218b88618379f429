"""The workers' one HTTP client of the moeops REST API (httpx, no Django).

Configured by MOEOPS_URL (e.g. http://127.0.0.1:8000) and MOEOPS_TOKEN (a host's token).
Every request is retried with exponential backoff on connection errors, 5xx and 429. Pushes
of results (runs, levels, telemetry, topology, health checks, GPU readings, kernel configs,
tuning runs) that still cannot reach the web tier are written to a spool folder
(MOEOPS_SPOOL_DIR, default spool/ in tuning.cache_dir) and replayed before the next push, or by
`replay_spool()`; the API's idempotency keys (run, check and reading UUIDs, level keys, batch
ids) make a replay store once. A push of a body the wire defines (domain.wire: a level, a run's
or tune's progress, samples, timings, a heartbeat, an action's report) is validated against its
model first: one the API would refuse raises BadPush here, and is neither sent nor spooled.
Pushes of one resource (a run, a tune, a host, …) keep their order; a push the API keeps failing
is retried with backoff and then moved to spool/rejected/, and holds back only the later pushes
of its own resource. A push refused with 409 (a finished
run takes no more results) and a file that holds no push (SpoolRecord) are moved there at once.

    client = MoeopsClient()
    run = client.create_run("glm-5-sglang", label="sweep")
    client.update_run(run["uuid"], status="running")
    client.post_telemetry(run["uuid"], samples, batch_id="b-0001")
"""

import base64
import contextlib
import fcntl
import json
import logging
import math
import os
import random
import time
import uuid
from email.message import Message
from pathlib import Path
from typing import Annotated, Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from domain.step_breakdown import LevelProfile
from domain.wire.engines import ActionReport, Heartbeat
from domain.wire.levels import Level
from domain.wire.runs import EngineSamples, Observed, RunPatch, Telemetry
from domain.wire.tunes import Timings, TuningRunPatch
from tuning.cache_dir import cache_dir

log = logging.getLogger(__name__)

DEFAULT_URL = "http://127.0.0.1:8000"
# The API takes up to 100,000 samples a request; 5,000 keeps a request near 1 MB.
TELEMETRY_BATCH = 5000
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
# A spooled push the API refuses (4xx) this many times is moved aside; one that fails (5xx) is
# moved aside once it has failed this many times and for SPOOL_GIVE_UP_S, while the web tier
# answers its health check (a web tier that is down fails every push, through no push's fault).
SPOOL_MAX_FAILURES = 5
SPOOL_GIVE_UP_S = 3600.0
# A failed push waits SPOOL_BACKOFF_S, doubling with each failure up to SPOOL_MAX_BACKOFF_S.
SPOOL_BACKOFF_S = 10.0
SPOOL_MAX_BACKOFF_S = 600.0
# One replay stops after this many failed pushes in a row: more are the web tier's trouble.
SPOOL_FAILURES_PER_REPLAY = 3


class ApiError(Exception):
    """The API answered with an error; `status` is the HTTP status (None: no answer)."""

    def __init__(self, status, message):
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
        self.message = message


class Unreachable(ApiError):
    """No usable answer after every retry: connection errors, 5xx or 429."""


class Conflict(ApiError):
    """409: e.g. a finished run asked to run again (the status is compare-and-set)."""


class NotFound(ApiError):
    """404: the run, deployment, host or config named does not exist."""


class BadPush(ValueError):
    """A body its wire model (domain.wire) refuses, as the API would: neither sent nor spooled.
    The message names the push and the first field refused."""


def _finite(value):
    """JSON has no NaN or Infinity: non-finite floats become null (unknown, or unlimited)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def _encode(body):
    return json.dumps(_finite(body), separators=(",", ":")).encode()


def _wire(model, body, what):
    """The body (a dict, or an instance of model) as the API takes it, once `model`
    (domain.wire) holds it valid: non-finite floats null first, as they are sent; only the keys
    given, as they were given. Raises BadPush naming the first field refused."""
    if isinstance(body, BaseModel):
        body = body.model_dump(exclude_unset=True)
    try:
        valid = model.model_validate(_finite(body))
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "body"
        raise BadPush(f"{what}: {field}: {first['msg']}") from None
    return valid.model_dump(mode="json", exclude_unset=True)


def _message(response):
    """The API's one-line error message."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:300] or response.reason_phrase
    if isinstance(body, dict):
        message = body.get("message") or body.get("detail")
        if isinstance(message, str):
            return message
        return json.dumps(message)
    return str(body)[:300]


def _stream(path, body):
    """The resource a push writes, whose pushes keep their order: the path's collection and id
    (/runs/<uuid>/levels → runs <uuid>), a create's id being the uuid its body carries."""
    parts = path.strip("/").split("/")
    ref = parts[1] if len(parts) > 1 else body.get("uuid") if isinstance(body, dict) else None
    return parts[0], ref


# An epoch (s) or a count as a spool entry may hold: finite, and small enough to compute with.
_Epoch = Annotated[float, Field(ge=0, le=1e11)]


class SpoolRecord(BaseModel):
    """One spooled push as its file holds it; anything else in a spool file is not an entry."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False)

    method: Literal["POST", "PATCH", "PUT", "DELETE"]
    # the API path the push goes to (a deployment's or host's name may hold spaces)
    path: str = Field(pattern=r"^/[^\x00-\x1f\x7f]*$", max_length=2000)
    body: dict[str, Any]
    spooled_at: _Epoch | None = None
    failures: int = Field(0, ge=0, le=1_000_000)
    failing_since: _Epoch | None = None
    retry_at: _Epoch | None = None
    error: str = ""


class NotAnEntry(ValueError):
    """A spool file that does not hold a push (the message says why)."""


def _spool_record(raw):
    """The SpoolRecord a spool file's bytes hold; raises NotAnEntry naming what is wrong."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise NotAnEntry(f"not JSON: {str(exc)[:200] or type(exc).__name__}") from None
    if not isinstance(data, dict):
        raise NotAnEntry(f"a JSON {type(data).__name__}, not an object")
    try:
        return SpoolRecord.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "entry"
        raise NotAnEntry(f"{field}: {first['msg']}") from None


class Spool:
    """Pushes waiting for the web tier: one JSON file each, replayed oldest first.

    A push that fails is retried with backoff (clock: UTC epoch s) and moved to rejected/
    after max_failures refusals (4xx), or failures (5xx) lasting give_up_s.
    """

    def __init__(
        self,
        folder,
        *,
        max_failures=SPOOL_MAX_FAILURES,
        give_up_s=SPOOL_GIVE_UP_S,
        backoff_s=SPOOL_BACKOFF_S,
        max_backoff_s=SPOOL_MAX_BACKOFF_S,
        clock=time.time,
    ):
        self.folder = Path(folder)
        self.rejected = self.folder / "rejected"
        self.max_failures = max_failures
        self.give_up_s = give_up_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.clock = clock
        self._count = 0
        # entry name → its stream, so that a push reads each waiting file once
        self._streams = {}

    @contextlib.contextmanager
    def locked(self):
        """One process at a time appends or replays (Celery runs several per host)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def entries(self):
        if not self.folder.is_dir():
            return []
        return sorted(self.folder.glob("*.json"))

    def append(self, method, path, body):
        """Write a push durably (temporary file, fsync, rename)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self._count += 1
        name = f"{time.time_ns():020d}-{os.getpid()}-{self._count:06d}.json"
        record = {"method": method, "path": path, "body": body, "spooled_at": time.time()}
        self._write(self.folder / name, record)
        return self.folder / name

    def _write(self, entry, record):
        temporary = self.folder / f".{entry.name}.tmp"
        with open(temporary, "wb") as out:
            out.write(_encode(record))
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, entry)

    def read(self, entry):
        """The entry's SpoolRecord; raises NotAnEntry (the reason) for a file that holds none or
        cannot be read (a directory, a dangling link, no permission), which the replay then
        moves aside."""
        try:
            raw = entry.read_bytes()
        except OSError as exc:
            raise NotAnEntry(f"cannot be read: {exc.strerror or type(exc).__name__}") from None
        return _spool_record(raw)

    def reject(self, entry, reason):
        """Keep a push aside, with the reason, out of the queue (spool/rejected/). Returns
        whether it moved: an entry that cannot be moved either (rejected/ not a folder, a
        read-only spool) stays where it is, and is logged, rather than ending the push that
        found it."""
        try:
            self.rejected.mkdir(parents=True, exist_ok=True)
            os.replace(entry, self.rejected / entry.name)
            (self.rejected / f"{entry.stem}.reason.txt").write_text(reason + "\n")
        except OSError as exc:
            log.error("spool entry %s could not be moved aside (%s): %s", entry.name, reason, exc)
            return False
        return True

    def rejected_count(self):
        """How many pushes were moved aside (what the host's heartbeat reports)."""
        return len(list(self.rejected.glob("*.json"))) if self.rejected.is_dir() else 0

    def stream(self, entry, record=None):
        """The resource the entry's push writes (_stream), None for an unreadable entry."""
        if entry.name not in self._streams:
            if record is None:
                try:
                    record = self.read(entry)
                except (OSError, NotAnEntry):
                    return None
            self._streams[entry.name] = _stream(record.path, record.body)
        return self._streams[entry.name]

    def holds(self, stream):
        """Whether a push of that resource still waits (a new one must go behind it)."""
        return any(self.stream(entry) == stream for entry in self.entries())

    def due(self, record):
        return (record.retry_at or 0) <= self.clock()

    def failed(self, entry, record, reason, *, refused):
        """Count a failed replay of the entry's SpoolRecord (refused: a 4xx); move it aside when
        it has failed enough, else rewrite it to wait its backoff. Returns whether it was moved."""
        now = self.clock()
        failures = record.failures + 1
        since = record.failing_since or now
        given_up = failures >= self.max_failures and (refused or now - since >= self.give_up_s)
        if given_up and self.reject(entry, f"{reason} ({failures} failures since {since:.0f})"):
            return True
        delay = min(self.backoff_s * 2 ** min(failures - 1, 32), self.max_backoff_s)
        updated = record.model_copy(
            update={
                "failures": failures,
                "failing_since": since,
                "retry_at": now + delay,
                "error": reason,
            }
        )
        self._write(entry, updated.model_dump(exclude_defaults=True))
        return False


class MoeopsClient:
    """The REST API with a host's token; see the module docstring.

    retries: attempts after the first; backoff_s doubles each attempt up to max_backoff_s.
    spool: False turns spooling off (pushes then raise Unreachable, as the CLI wants).
    transport: an httpx transport (tests pass httpx.WSGITransport or MockTransport).
    """

    def __init__(
        self,
        base_url=None,
        token=None,
        *,
        spool=True,
        spool_dir=None,
        retries=4,
        backoff_s=0.5,
        max_backoff_s=30.0,
        timeout_s=60.0,
        transport=None,
        sleep=time.sleep,
        clock=time.time,
    ):
        base_url = (base_url or os.getenv("MOEOPS_URL") or DEFAULT_URL).rstrip("/")
        token = token if token is not None else os.getenv("MOEOPS_TOKEN", "")
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.base_url = base_url
        self.http = httpx.Client(
            base_url=f"{base_url}/api/v1", headers=headers, timeout=timeout_s, transport=transport
        )
        folder = spool_dir or os.getenv("MOEOPS_SPOOL_DIR") or cache_dir() / "spool"
        self.spool = Spool(folder, clock=clock) if spool else None
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._sleep = sleep

    def close(self):
        self.http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------ transport

    def _delay(self, attempt, response):
        retry_after = response.headers.get("Retry-After") if response is not None else None
        if retry_after is not None:
            with contextlib.suppress(ValueError):
                return min(float(retry_after), self.max_backoff_s)
        delay = min(self.backoff_s * 2**attempt, self.max_backoff_s)
        # a little jitter so that the workers of a fleet do not retry in step
        return delay * (1 + random.random() / 10)

    def request(self, method, path, *, body=None, params=None, retries=None):
        """The response of a 2xx answer; raises Unreachable, Conflict, NotFound or ApiError."""
        retries = self.retries if retries is None else retries
        content = _encode(body) if body is not None else None
        for attempt in range(retries + 1):
            response = failure = None
            try:
                response = self.http.request(method, path, content=content, params=params)
            except httpx.TransportError as exc:
                failure = f"{type(exc).__name__}: {exc}"
            if response is not None and response.status_code not in RETRY_STATUSES:
                return self._checked(response)
            if response is not None:
                failure = f"{response.status_code}: {_message(response)}"
            if attempt < retries:
                delay = self._delay(attempt, response)
                log.info(
                    "moeops API %s %s failed (%s); retry in %.1f s", method, path, failure, delay
                )
                self._sleep(delay)
        status = response.status_code if response is not None else None
        raise Unreachable(status, f"{method} {self.base_url}/api/v1{path}: {failure}")

    @staticmethod
    def _checked(response):
        if response.is_success:
            return response
        message = _message(response)
        error = {409: Conflict, 404: NotFound}.get(response.status_code, ApiError)
        raise error(response.status_code, message)

    def _get(self, path, **params):
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None})

    def _push(self, method, path, body):
        """A write that must not be lost: sent now, else spooled behind earlier ones.

        Returns the API's JSON answer, or {"spooled": True} when it waits in the spool.
        """
        if self.spool is None:
            return self.request(method, path, body=body).json()
        reachable = True
        if self.spool.entries():
            _, _, reachable = self._replay()
        with self.spool.locked():
            # keep the order of one resource's pushes: none overtakes one still waiting; and
            # while the web tier does not answer, a push waits without its retries' delays
            if reachable and not self.spool.holds(_stream(path, body)):
                try:
                    return self.request(method, path, body=body).json()
                except Unreachable as exc:
                    log.warning("moeops API unreachable, spooling %s %s: %s", method, path, exc)
            self.spool.append(method, path, body)
        return {"spooled": True}

    def replay_spool(self):
        """Send the spooled pushes that are due, oldest first; returns (sent, still waiting).

        A push that fails waits its backoff and holds back the later pushes of its resource
        only; after Spool.max_failures refusals (4xx), or failures (5xx) for Spool.give_up_s
        while the web tier answers its health check, it is moved to spool/rejected/ with the
        reason, and so are at once a push refused with 409 (final) and a file that holds no
        push. No answer at all (or a 429, or a health check that fails) ends the replay:
        the web tier, not a push, is at fault.
        """
        sent, waiting, _ = self._replay()
        return sent, waiting

    def _replay(self):
        """(sent, still waiting, whether the web tier answered)."""
        if self.spool is None:
            return 0, 0, True
        sent = failed_in_a_row = 0
        reachable = True
        with self.spool.locked():
            held = set()
            for entry in self.spool.entries():
                try:
                    record = self.spool.read(entry)
                except NotAnEntry as exc:
                    log.warning("spool entry %s is not a push, moved aside: %s", entry.name, exc)
                    self.spool.reject(entry, f"not a spool entry: {exc}")
                    continue
                stream = self.spool.stream(entry, record)
                if stream in held or not self.spool.due(record):
                    held.add(stream)
                    continue
                try:
                    self.request(record.method, record.path, body=record.body, retries=0)
                except Unreachable as exc:
                    if exc.status in (None, 429) or not self._healthy():
                        reachable = False
                        break
                    moved = self._spool_failed(entry, record, exc, refused=False)
                    failed_in_a_row += 1
                except Conflict as exc:
                    # the resource moved on (a finished run takes no more results): final
                    log.warning("moeops API refused spooled %s as final: %s", entry.name, exc)
                    self.spool.reject(entry, f"{exc} (final: not retried)")
                    continue
                except ApiError as exc:
                    moved = self._spool_failed(entry, record, exc, refused=True)
                    failed_in_a_row += 1
                else:
                    entry.unlink()
                    sent += 1
                    failed_in_a_row = 0
                    continue
                if not moved:
                    held.add(stream)
                if failed_in_a_row >= SPOOL_FAILURES_PER_REPLAY:
                    break
            return sent, len(self.spool.entries()), reachable

    def _spool_failed(self, entry, record, exc, *, refused):
        moved = self.spool.failed(entry, record, str(exc), refused=refused)
        what = "moved aside" if moved else "to be retried"
        log.warning("moeops API failed spooled %s (%s): %s", entry.name, what, exc)
        return moved

    def _healthy(self):
        """Whether the web tier answers its health check: then a 5xx is the push's own."""
        try:
            self.request("GET", "/health", retries=0)
        except ApiError:
            return False
        return True

    # ------------------------------------------------------------------ runs

    def create_run(self, deployment, *, run_uuid=None, label="", parameters=None, **fields):
        """Create a sweep run of a deployment (name or id); returns the run.

        The UUID is chosen here so that a retried or spooled create stores one run; when the
        push is spooled the answer is {"uuid": …, "spooled": True}.
        """
        run_uuid = str(run_uuid or uuid.uuid4())
        body = {
            "deployment": str(deployment),
            "uuid": run_uuid,
            "label": label,
            "parameters": parameters or {},
            **fields,
        }
        return {"uuid": run_uuid} | self._push("POST", "/runs", body)

    def get_run(self, run):
        """The run (id or UUID) as the API has it, `cancel_requested` included."""
        return self._get(f"/runs/{run}").json()

    def get_tuning_run(self, tuning_run):
        """The tuning run (id or UUID) as the API has it."""
        return self._get(f"/tuning-runs/{tuning_run}").json()

    def list_runs(self, *, deployment=None, status=None, limit=100):
        """Runs newest first: {"items": [...], "count": N}."""
        return self._get("/runs", deployment=deployment, status=status, limit=limit).json()

    def _patch(self, path, model, what, *, status, advisory, fields):
        """A PATCH of a job's state, its fields given (None: left as they are) and checked
        against model: pushed (spooled while the web tier is away), or, advisory (progress the
        next push supersedes), sent once and never spooled."""
        body = {key: value for key, value in fields.items() if value is not None}
        if status is not None:
            body["status"] = status
        body = _wire(model, body, what)
        if advisory:
            return self.request("PATCH", path, body=body, retries=0).json()
        return self._push("PATCH", path, body)

    def update_run(self, run, *, status=None, advisory=False, **fields):
        """Status (compare-and-set: raises Conflict on an illegal move), progress, error, …;
        advisory: see _patch."""
        path = f"/runs/{run}"
        return self._patch(path, RunPatch, "run", status=status, advisory=advisory, fields=fields)

    def take_over_run(self, run, attempt, progress):
        """Take a running run whose worker is gone over as `attempt` (raises Conflict when
        another delivery took it first). Sent now or never: a takeover that waited in the spool
        would come too late to mean anything."""
        body = _wire(RunPatch, {"takeover": attempt, "progress": progress}, "run takeover")
        return self.request("PATCH", f"/runs/{run}", body=body).json()

    def post_observed(self, run, observed):
        """What the sweep saw of the engine at its start, into the run's snapshot (set once)."""
        return self._push("POST", f"/runs/{run}/snapshot", _wire(Observed, observed, "observed"))

    def cancel_run(self, run):
        return self.request("POST", f"/runs/{run}/cancel").json()

    def get_levels(self, run):
        return self._get(f"/runs/{run}/levels").json()

    def post_level(self, run, level):
        """One round of a level (domain.wire.levels.Level, or a dict of its fields: vLLM result
        key names); stored once per (concurrency, request rate, round)."""
        return self._push("POST", f"/runs/{run}/levels", _wire(Level, level, "level"))

    def post_profile(self, run, profile):
        """A profiled level (domain.step_breakdown.LevelProfile), validated before it is sent or
        spooled; stored once per (concurrency, request rate, attempt)."""
        body = LevelProfile.model_validate(profile).model_dump(mode="json")
        return self._push("POST", f"/runs/{run}/profiles", body)

    def post_levels(self, run, levels):
        return [self.post_level(run, level) for level in levels]

    def _post_samples(self, path, samples, batch_id, model=Telemetry):
        samples = list(samples)
        chunks = [samples[i : i + TELEMETRY_BATCH] for i in range(0, len(samples), TELEMETRY_BATCH)]
        # a stable id per chunk, so a resent chunk is stored once
        ids = [batch_id if len(chunks) == 1 else f"{batch_id}.{i}" for i in range(len(chunks))]
        # every chunk checked before the first is sent: a bad sample pushes none of its batch
        bodies = [
            _wire(model, {"batch_id": chunk_id, "samples": chunk}, "samples")
            for chunk_id, chunk in zip(ids, chunks, strict=True)
        ]
        return [self._push("POST", path, body) for body in bodies]

    def post_telemetry(self, run, samples, batch_id):
        """GPU samples (dicts of domain.wire.runs.TelemetrySample fields) under a
        client-chosen batch id."""
        return self._post_samples(f"/runs/{run}/telemetry", samples, batch_id)

    def post_engine_samples(self, run, samples, batch_id):
        """Engine /metrics samples (ts, running, queued, kv_cache_usage) under a batch id."""
        path = f"/runs/{run}/engine-samples"
        return self._post_samples(path, samples, batch_id, model=EngineSamples)

    def import_results(
        self,
        *,
        fmt,
        deployment,
        content,
        file_name="",
        label="",
        accept_mismatch=False,
        requests_content="",
    ):
        """Import a result file's text as a run (never spooled: a person waits);
        accept_mismatch: import it even where it states another model, TP, GPUs or engine;
        requests_content: the file beside it, AIPerf's per-request records or inference-perf's
        run configuration."""
        body = {
            "format": fmt,
            "deployment": str(deployment),
            "content": content,
            "file_name": file_name,
            "label": label,
            "accept_mismatch": accept_mismatch,
        }
        if requests_content:
            body["requests_content"] = requests_content
        return self.request("POST", "/runs/import", body=body).json()

    # ------------------------------------------------------------------ hosts

    def post_topology(self, host, snapshot=None, *, nvidia_smi_topo=None, nvidia_smi_p2p=None):
        """A probe snapshot, or nvidia-smi topo text; stored only when the host changed."""
        body = {"snapshot": snapshot}
        if nvidia_smi_topo is not None:
            body = {"nvidia_smi_topo": nvidia_smi_topo, "nvidia_smi_p2p": nvidia_smi_p2p}
        body["captured_at"] = time.time()
        return self._push("POST", f"/hosts/{host}/topology", body)

    def post_gpus(self, host, gpus):
        """Create or update the host's GPUs by index."""
        return self._push("POST", f"/hosts/{host}/gpus", {"gpus": gpus})

    def update_deployment(self, deployment, **fields):
        """e.g. engine_version="0.5.6", or a status such as status="stopped"."""
        return self._push("PATCH", f"/deployments/{deployment}", fields)

    def post_health_check(self, deployment, result, *, trigger, checked_at=None, check_uuid=None):
        """A check of the deployment's engine (workers.engine_check.check_engine's result) into
        its health history; the newest check sets the deployment's status. checked_at: UTC
        epoch s (default now). The UUID is chosen here so that a retried or spooled push
        stores one check."""
        body = {
            **result,
            # the API keeps a sentence of at most 300 characters
            "detail": (result.get("detail") or "")[:300],
            "uuid": str(check_uuid or uuid.uuid4()),
            "checked_at": checked_at if checked_at is not None else time.time(),
            "trigger": trigger,
        }
        return self._push("POST", f"/deployments/{deployment}/health-checks", body)

    def post_gpu_reading(self, host, reading, *, reading_uuid=None):
        """Every GPU of the host read once (workers.telemetry.read_gpus_now's dict), or why
        not; the UUID makes a retried or spooled push store one reading."""
        body = {**reading, "uuid": str(reading_uuid or uuid.uuid4())}
        return self._push("POST", f"/hosts/{host}/gpu-readings", body)

    def post_heartbeat(self, host, status):
        """The worker is alive (status: worker, managed engines, spool); one attempt, never
        spooled: a late heartbeat says nothing."""
        body = _wire(Heartbeat, status, "heartbeat")
        return self.request("POST", f"/hosts/{host}/heartbeat", body=body, retries=0).json()

    # ------------------------------------------------------------------ engine actions

    def report_action(self, action, *, status=None, advisory=False, **fields):
        """An engine action's steps, observed engine, log tail, error and status (running,
        sweeping, succeeded, failed); status moves are compare-and-set (Conflict); advisory:
        see _patch."""
        path = f"/engine-actions/{action}"
        return self._patch(
            path, ActionReport, "action report", status=status, advisory=advisory, fields=fields
        )

    def get_engine_action(self, action):
        """The engine action (id or UUID) as the API has it."""
        return self._get(f"/engine-actions/{action}").json()

    def take_over_action(self, action, attempt, progress):
        """Take a running engine action whose worker is gone over as `attempt` (Conflict when
        another delivery took it first); sent now or never, as take_over_run."""
        body = _wire(ActionReport, {"takeover": attempt, "progress": progress}, "action takeover")
        return self.request("PATCH", f"/engine-actions/{action}", body=body).json()

    # ------------------------------------------------------------------ kernels

    def push_kernel_config(self, file_name, content):
        """An engine config file by its name and content (text or JSON object)."""
        body = {"file_name": file_name, "content": content}
        return self._push("POST", "/kernel-configs/import", body)

    def push_workload(self, name, spec, *, file_name="", data=None, context_len=None):
        """A new version of the workload `name` (domain.workloads' spec); data: a dataset
        file's bytes, sent as base64 (a binary file is refused by the API, by its name)."""
        body = {"name": name, "spec": spec, "file_name": file_name}
        if data is not None:
            body["content_base64"] = base64.b64encode(data).decode()
        if context_len is not None:
            body["context_len"] = context_len
        return self._push("POST", "/workloads", body)

    def get_kernel_config(self, config_id):
        return self._get(f"/kernel-configs/{config_id}").json()

    def export_kernel_config(self, config_id, style="vllm"):
        """(file name, path relative to the engine's configs folder, exact file text)."""
        response = self._get(f"/kernel-configs/{config_id}/file", style=style)
        disposition = response.headers.get("Content-Disposition", "")
        name = _attachment_name(disposition)
        return name, response.headers.get("X-Config-Path", name), response.text

    def post_tuning_run(self, *, run_uuid=None, **fields):
        """Create a tuning run (E, N, hidden_size, topk, dtype, host, …); returns it."""
        run_uuid = str(run_uuid or uuid.uuid4())
        return {"uuid": run_uuid} | self._push("POST", "/tuning-runs", {"uuid": run_uuid, **fields})

    def update_tuning_run(self, tuning_run, *, status=None, advisory=False, **fields):
        """Status (compare-and-set: Conflict), progress, result, the kernel timed, …; advisory:
        see _patch."""
        path = f"/tuning-runs/{tuning_run}"
        return self._patch(
            path, TuningRunPatch, "tuning run", status=status, advisory=advisory, fields=fields
        )

    def take_over_tuning_run(self, tuning_run, attempt, progress):
        """Take a running tune whose worker is gone over as `attempt` (Conflict when another
        delivery took it first); sent now or never, as take_over_run."""
        body = {"takeover": attempt, "progress": progress}
        body = _wire(TuningRunPatch, body, "tuning run takeover")
        return self.request("PATCH", f"/tuning-runs/{tuning_run}", body=body).json()

    def post_tuning_timings(self, tuning_run, timings):
        """Per batch size: tuned_us, default_us, floor_us, config, …; each stored once."""
        body = _wire(Timings, {"timings": timings}, "timings")
        return self._push("POST", f"/tuning-runs/{tuning_run}/timings", body)

    def post_tuning_telemetry(self, tuning_run, samples, batch_id):
        """GPU samples taken during a tune (dicts of TelemetrySample fields) under a batch id."""
        return self._post_samples(f"/tuning-runs/{tuning_run}/telemetry", samples, batch_id)


def _attachment_name(disposition):
    """The file name of a Content-Disposition header (RFC 6266, as Django writes it)."""
    message = Message()
    message["Content-Disposition"] = disposition
    return message.get_filename() or ""
