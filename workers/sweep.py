"""A concurrency sweep as a GPU-host worker runs it, over the REST API; no Celery needed.

`run_sweep(run_uuid, parameters, client=...)` claims the run (queued → running), starts the NVML
and engine /metrics samplers, runs each level with the load generator (`rounds` times in a row
when asked), pushes each round of a level as it finishes and the samples in batches, reports
progress about once a second, stops at the next request boundary once the run's
`cancel_requested` is set, and ends the run succeeded, cancelled or failed; finished levels are
always kept, and so are the finished requests of the level the stop cut short (stored as a level
whose raw result says "stopped"). A run delivered again (its worker died) resumes: the levels
and rounds already stored are skipped, so none is stored twice, and the levels and samples of
each delivery carry its attempt number (1, 2, …), so that the samples the dead attempt took of
the level it cut short are told apart from those of the level stored.
"""

import contextlib
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field

from domain import request_log
from domain import workloads as workload_specs
from domain.failures import describe_failure
from domain.levels import MAX_SEED
from domain.progress import HEARTBEAT_STALE_S
from domain.snapshot import RunSnapshot
from domain.step_breakdown import DEFAULT_PROFILE_STEPS
from domain.wire.levels import LevelFigures
from workers import capacity, engine_info, engine_paths, job, loadgen, step_profile, vocabulary
from workers.client import ApiError, Conflict, MoeopsClient, Unreachable
from workers.engine_metrics import EngineMetricsSampler, counter_deltas, read_engine_counters
from workers.job import BUSY as BUSY
from workers.telemetry import TelemetrySampler, push_drained

log = logging.getLogger(__name__)

# The outcome when the API refused this delivery's pushes (409) while it swept: another
# delivery took the run over, or the run was ended meanwhile (cancelled while its worker seemed
# gone); either way the run's end is not this delivery's.
TAKEN_OVER = "taken over"

PROGRESS_INTERVAL_S = 1.0
SAMPLES_INTERVAL_S = 5.0
# The keys of a load-generator result that the API stores as LevelResult columns: what the
# level is, its metrics and how its requests went (the wire's LevelFigures).
LEVEL_FIELDS = tuple(LevelFigures.model_fields)


# A later delivery's prompts: its seed this far from the last delivery's (more than the rounds
# a level runs, so no round of one is a round of the other).
DELIVERY_SEED_STRIDE = 1_000_003


def sweep_config(parameters, attempt=1):
    """The load generator's SweepConfig from a run's parameters, for its delivery `attempt`.

    parameters: base_url, model, levels (concurrencies), input_len and output_len (tokens);
    optional endpoint, prompts_per_level, warmup, request_rate or request_rates (req/s),
    burstiness, ramp_up_s (s), processes, vocab_size, timeout_s, slo_ttft_ms, slo_tpot_ms,
    slo_e2el_ms, rounds, seed (the prompts'), workload (its record and spec) with workload_items
    (a dataset's prompts). Without vocab_size the completions endpoint asks the server where its
    model is (workers.vocabulary) and raises vocabulary.VocabularyUnknown when it cannot tell.
    A later attempt draws other prompts than the seed's: the engine's prefix cache holds the
    requests the delivery cut short had finished, and the round it reruns would meet them warm.
    """
    endpoint = parameters.get("endpoint") or "completions"
    vocab_size = parameters.get("vocab_size")
    if endpoint == "completions" and vocab_size is None:
        vocab_size, _ = vocabulary.resolve(
            base_url=parameters["base_url"], model=parameters["model"]
        )
    client = loadgen.ClientConfig(
        base_url=parameters["base_url"],
        model=parameters["model"],
        endpoint=endpoint,
        vocab_size=vocab_size,
        timeout_s=parameters.get("timeout_s") or 600.0,
        seed=(int(parameters.get("seed") or 0) + (attempt - 1) * DELIVERY_SEED_STRIDE)
        % (MAX_SEED + 1),
        workload=sweep_workload(parameters),
    )
    optional = (
        "prompts_per_level",
        "warmup",
        "request_rate",
        "burstiness",
        "ramp_up_s",
        "processes",
        "slo_ttft_ms",
        "slo_tpot_ms",
        "slo_e2el_ms",
        "rounds",
    )
    return loadgen.SweepConfig(
        client=client,
        # a capacity search chooses its levels as it goes (workers.capacity)
        concurrencies=tuple(int(c) for c in parameters.get("levels") or ()),
        input_len=int(parameters["input_len"]),
        output_len=int(parameters["output_len"]),
        request_rates=tuple(float(r) for r in parameters.get("request_rates") or ()),
        **{k: parameters[k] for k in optional if parameters.get(k) is not None},
    )


def sweep_workload(parameters):
    """The load generator's workload from a run's parameters (None: random token ids). A
    dataset's prompts are tokenized with the model's tokenizer where the server's model folder
    is on this host, else sent as text; a file's conversations (multi-turn) go as text, their
    answers counted in that tokenizer's tokens, else in words."""
    named = parameters.get("workload")
    if not isinstance(named, dict):
        return None
    spec = named["spec"]
    workload = {"spec": spec}
    if spec["kind"] == "trace":
        # a trace's lengths are tokens already: its prompts are built of token blocks
        workload["items"] = parameters.get("workload_items") or []
        if not workload["items"]:
            raise ValueError(f"workload {named.get('name')!r}: its trace's requests did not come")
        return workload
    if spec["kind"] == "dataset" or spec.get("from_file"):
        tokenizer = vocabulary.model_tokenizer(
            base_url=parameters["base_url"], model=parameters["model"]
        )
        prepare = loadgen.dataset_items if spec["kind"] == "dataset" else loadgen.conversation_items
        workload["items"] = prepare(parameters.get("workload_items") or [], tokenizer)
        if not workload["items"]:
            raise ValueError(f"workload {named.get('name')!r}: its dataset's prompts did not come")
        if tokenizer is not None:
            # the workload page's histograms in the tokens of the model the engine serves
            workload["token_lengths"] = {
                "model": parameters["model"],
                **workload_specs.file_lengths(
                    spec,
                    parameters.get("workload_items") or [],
                    lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids),
                ),
            }
    return workload


def with_workload_tokens(result, config):
    """The load generator's result with the workload's token-length histograms (raw's
    "workload_tokens", shown by the workload page) where the worker could count them."""
    counted = (config.client.workload or {}).get("token_lengths")
    return {**result, "workload_tokens": counted} if counted else result


def level_payload(result, attempt=1, round_number=1):
    """The API's level body from a load-generator result, taken by the run's delivery
    `attempt` in the level's round `round_number`: its requests travel packed as request_log
    (their ITLs capped, domain.request_log), the rest of the result as raw."""
    result = dict(result)
    columns = result.pop("requests", None)
    payload = {k: result[k] for k in LEVEL_FIELDS if result.get(k) is not None}
    payload["attempt"] = attempt
    if round_number > 1:
        payload["round"] = round_number
    if columns is not None:
        columns, dropped = request_log.capped(columns)
        result["requests_itl_dropped"] = dropped
        payload["request_log"] = request_log.pack(columns)
    payload["raw"] = result
    return payload


def _level_id(concurrency, request_rate, round_number=1):
    # the API's idempotency key of a level's round: unlimited rate is None
    rate = None if request_rate is None or request_rate == float("inf") else float(request_rate)
    return concurrency, rate, round_number


def _stored_rounds(levels):
    """The (concurrency, rate, round) of every round the API holds, from its levels."""
    return {
        _level_id(level["concurrency"], level["request_rate"], n)
        for level in levels
        for n in level.get("rounds") or [1]
    }


class _Progress:
    """Where the sweep is, shared by the level loop (writer) and the reporter (reader)."""

    def __init__(self, levels_total, attempt):
        self._lock = threading.Lock()
        self.attempt = attempt
        self.state = {
            "attempt": attempt,
            "level_index": 0,
            "levels_total": levels_total,
            "levels_done": 0,
            "concurrency": None,
            "requests_done": 0,
            "requests_total": 0,
        }

    def update(self, **changes):
        with self._lock:
            self.state.update(changes)

    def snapshot(self):
        with self._lock:
            return {**self.state, "heartbeat": time.time(), "worker": job.me()}


@dataclass
class _Samples:
    """Hands the samplers' readings (telemetry's and engine's) to the API in batches, each
    under a fresh batch id and each sample marked with the run's delivery `attempt`;
    engine_sent: how many of the engine's samples went."""

    client: MoeopsClient
    run: str
    telemetry: TelemetrySampler
    engine: EngineMetricsSampler
    attempt: int
    engine_sent: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def tag(self, concurrency):
        """Samples taken from now on belong to the level at this concurrency (None: none)."""
        self.telemetry.level_concurrency = self.engine.level_concurrency = concurrency

    def _marked(self, samples):
        return [{**sample, "attempt": self.attempt} for sample in samples]

    def flush(self):
        with self.lock:
            try:
                push_drained(
                    self.telemetry,
                    lambda samples, batch_id: self.client.post_telemetry(
                        self.run, self._marked(samples), batch_id=batch_id
                    ),
                )
                engine = self._marked(self.engine.samples[self.engine_sent :])
                self.engine_sent += len(engine)
                if engine:
                    self.client.post_engine_samples(self.run, engine, batch_id=uuid.uuid4().hex)
            except Conflict as exc:
                # the run was ended meanwhile: it takes no more samples, a retry would not help
                log.warning("sweep %s: samples refused: %s", self.run, exc)


class _Pushes:
    """What the heartbeat pushes beside the progress: the spool's waiting pushes, and the
    samples every SAMPLES_INTERVAL_S."""

    def __init__(self, client, run_uuid, samples):
        self._client = client
        self._run = run_uuid
        self._samples = samples
        self._last_flush = time.monotonic()

    def __call__(self):
        try:
            if self._client.spool is not None and self._client.spool.entries():
                self._client.replay_spool()
            if time.monotonic() - self._last_flush >= SAMPLES_INTERVAL_S:
                self._last_flush = time.monotonic()
                self._samples.flush()
        except ApiError:
            log.warning("sweep %s: pushing samples failed", self._run, exc_info=True)


def run_sweep(
    run_uuid,
    parameters,
    *,
    client,
    nvml=None,
    telemetry_hz=1.0,
    deadline=None,
    stale_after_s=HEARTBEAT_STALE_S,
    progress_interval_s=PROGRESS_INTERVAL_S,
):
    """Run the sweep of run `run_uuid` and return the run's final status (or BUSY).

    parameters: see sweep_config, plus gpu_indices (the deployment's NVML indices; None for
    all). deadline: a time.monotonic() value after which no new request starts and the run ends
    failed. nvml: a pynvml stand-in for tests.
    """
    sweep = job.Job(client, job.SWEEP, run_uuid, stale_after_s=stale_after_s)
    claimed = sweep.claim({"levels_done": 0})
    if isinstance(claimed, str):
        return claimed
    attempt = sweep.attempt
    try:
        config = sweep_config(parameters, attempt)
    except ValueError as exc:
        # the vocabulary unknown (VocabularyUnknown), or a dataset's prompts missing
        _finish(client, run_uuid, "failed", str(exc), {"worker": job.me()})
        return "failed"
    snapshot = RunSnapshot.read(claimed.get("snapshot"))
    levels = config.levels()
    stored_levels = client.get_levels(run_uuid)
    stored = _stored_rounds(stored_levels)
    progress = _Progress(len(levels), attempt)
    # no GPUs recorded for the deployment: sample every GPU of the host
    telemetry = TelemetrySampler(parameters.get("gpu_indices") or None, hz=telemetry_hz, nvml=nvml)
    engine = EngineMetricsSampler(config.client.base_url)
    samples = _Samples(client, run_uuid, telemetry, engine, attempt)
    reporter = job.Heartbeat(
        sweep,
        progress.snapshot,
        progress_interval_s,
        log=log,
        each=_Pushes(client, run_uuid, samples),
    )
    reporter.cancelled = sweep.cancelled(claimed)

    def cancelled():
        return reporter.cancelled or reporter.taken_over

    def taken_over():
        return reporter.taken_over

    def out_of_time():
        return deadline is not None and time.monotonic() >= deadline

    status, error = None, ""
    try:
        with contextlib.ExitStack() as running:
            # unwinds in reverse: reporter, engine and NVML samplers stop, then the last flush
            running.callback(samples.flush)
            running.enter_context(telemetry)
            running.enter_context(engine)
            client.update_run(
                run_uuid,
                telemetry_status=telemetry.status,
                telemetry_detail=telemetry.detail,
                progress=progress.snapshot(),
            )
            reporter.start()
            running.callback(reporter.stop)
            observed = None
            if not snapshot.engine:
                # under the heartbeat: a vLLM's first /server_info and the build of its
                # defaults (workers.engine_defaults) take some seconds each
                observed = engine_info.observe(
                    config.client.base_url,
                    kernel_shape=snapshot.kernel_shape,
                    recorded_engine=snapshot.deployment.get("engine", ""),
                    engine_log=engine_paths.managed_log(
                        claimed.get("deployment"),
                        managed=bool(snapshot.recipe),
                        external=snapshot.deployment.get("engine_log") or "",
                    ),
                    gpu_indices=parameters.get("gpu_indices"),
                    tp=snapshot.deployment.get("tp"),
                )
                client.post_observed(run_uuid, observed)
            stops = (cancelled, out_of_time, taken_over)
            if parameters.get("kind") == "capacity":

                def push_round(result, round_number):
                    samples.flush()
                    result = with_workload_tokens(result, config)
                    payload = level_payload(result, progress.attempt, round_number)
                    return client.post_level(run_uuid, payload)

                status, error = capacity.run_search(
                    config, parameters, stored_levels, progress, samples, push_round, stops
                )
            else:
                engine_name = (snapshot.engine or (observed or {}).get("engine") or {}).get(
                    "engine", snapshot.deployment.get("engine", "")
                )
                profile = _Profile(parameters, engine_name, progress, samples)
                status, error = _run_levels(
                    client, run_uuid, config, levels, stored, progress, samples, stops, profile
                )
    except Unreachable:
        # the task tries again later and resumes from the stored levels
        status = None
        raise
    except Conflict as exc:
        # a level or the progress refused: the run was ended or taken over meanwhile
        log.warning("sweep %s: results refused, stopping: %s", run_uuid, exc)
        status = None
    except Exception as exc:
        status, error = "failed", f"{type(exc).__name__}: {exc}"
        raise
    finally:
        if status is not None:
            _finish(client, run_uuid, status, error, progress.snapshot())
    return status or TAKEN_OVER


class _Profile:
    """Which levels of a sweep get a profiled pass after their rounds (parameters' profile:
    {"levels": [concurrency, ...], "steps": N}), and that pass (workers.step_profile)."""

    def __init__(self, parameters, engine, progress, samples):
        self.progress = progress
        self.samples = samples
        asked = parameters.get("profile") or {}
        self.levels = {int(c) for c in asked.get("levels") or ()}
        self.steps = int(asked.get("steps") or DEFAULT_PROFILE_STEPS)
        self.engine = engine

    def after_rounds(self, client, run_uuid, config, level, throughputs, stops):
        """Run and push the level's profiled pass where one is asked for and the sweep goes
        on (not when another delivery took the run over meanwhile: `cancelled` then says so
        to the next round); its progress says it is profiling."""
        cancelled, out_of_time, taken_over = stops

        def should_stop():
            return cancelled() or out_of_time()

        if level.concurrency not in self.levels or should_stop():
            return
        unprofiled = sorted(throughputs)[len(throughputs) // 2] if throughputs else None
        # the pass's samples belong to no level: the window slows the engine
        self.samples.tag(None)
        self.progress.update(profiling=True, requests_done=0)
        try:
            body = self._pass(config, level, unprofiled, should_stop, self.progress.attempt)
        finally:
            self.progress.update(profiling=False)
        if not taken_over():
            client.post_profile(run_uuid, body)

    def _pass(self, config, level, unprofiled, should_stop, attempt):
        return step_profile.profile_level(
            # prompts of their own: the rounds' would meet the prefix cache warm
            config.round_client(config.rounds + 1),
            level,
            steps=self.steps,
            unprofiled_tok_s=unprofiled,
            engine=self.engine,
            should_stop=should_stop,
            attempt=attempt,
        )


def _run_levels(client, run_uuid, config, levels, stored, progress, samples, stops, profile):
    """Run the rounds of each level not stored yet, pushing each, and a profiled pass after
    those `profile` asks for; returns (final status, error), or (None, "") when another delivery
    took the run over: its levels and its end are that delivery's. stops: the callables
    (cancelled, out_of_time, taken_over)."""
    cancelled, out_of_time, taken_over = stops

    def should_stop():
        return cancelled() or out_of_time()

    rounds = range(1, config.rounds + 1)

    def level_done(lv):
        return all(_level_id(lv.concurrency, lv.request_rate, n) in stored for n in rounds)

    done = sum(level_done(lv) for lv in levels)
    progress.update(levels_done=done, rounds=config.rounds)
    for i, level in enumerate(levels):
        if level_done(level):
            continue
        throughputs = []
        for round_number in rounds:
            if _level_id(level.concurrency, level.request_rate, round_number) in stored:
                continue
            if should_stop():
                break
            progress.update(
                level_index=i,
                concurrency=level.concurrency,
                round=round_number,
                requests_done=0,
                requests_total=level.num_prompts,
            )
            samples.tag(level.concurrency)
            before = read_engine_counters(config.client.base_url)
            result = capacity.run_round(config, level, round_number, progress, should_stop)
            result["engine_counters"] = counter_deltas(
                before, read_engine_counters(config.client.base_url)
            )
            samples.tag(None)
            if taken_over():
                return None, ""
            payload = level_payload(
                with_workload_tokens(result, config), progress.attempt, round_number
            )
            if result["stopped"]:
                if result["completed"] or result["failed"]:
                    # the requests that finished before the stop are measurements too: the
                    # round is kept, marked by raw's "stopped" (and "num_prompts", what it was
                    # to send)
                    samples.flush()
                    client.post_level(run_uuid, payload)
                break
            samples.flush()
            client.post_level(run_uuid, payload)
            throughputs.append(result.get("output_throughput") or 0.0)
            if result["completed"] == 0:
                cause = result.get("all_failed_with") or ", ".join(
                    f"{describe_failure(reason, result['error_samples'].get(reason))} × {n}"
                    for reason, n in sorted(result["errors"].items())
                )
                return "failed", (
                    f"every request at concurrency {level.concurrency} failed: {cause}. "
                    "The sweep stopped there."
                )
        else:
            profile.after_rounds(client, run_uuid, config, level, throughputs, stops)
            done += 1
            progress.update(levels_done=done)
            continue
        break
    if taken_over():
        return None, ""
    if done == len(levels):
        return "succeeded", ""
    if cancelled():
        return "cancelled", ""
    return "failed", "the sweep ran out of time; the finished levels are kept"


def _finish(client, run_uuid, status, error, progress):
    try:
        client.update_run(run_uuid, status=status, error=error, progress=progress)
    except Conflict as exc:
        # someone else ended the run (e.g. failed it by hand); its levels are stored either way
        log.warning("sweep %s: could not end it %s: %s", run_uuid, status, exc)
