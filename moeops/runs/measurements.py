"""What a run measures, stored as it arrives: each level's rounds and request logs, the step
profiles of its levels (pushed by the worker or uploaded by hand), and the GPU telemetry and engine
samples of sweeps and kernel tunes."""

import json
import os
import tempfile
from operator import itemgetter

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction

from domain.intervals import ROUND_KEYS, level_of_rounds
from domain.step_breakdown import LevelProfile as LevelProfileBody
from domain.step_breakdown import StepBreakdown
from domain.step_trace import TraceError, read_breakdown
from domain.storable import storable_text
from moeops.keyed import body_sha256, same_body
from moeops.runs import rollup
from moeops.runs.keys import level_key
from moeops.runs.levels import level_problems, level_request_log
from moeops.runs.models import LevelProfile, LevelResult, LevelRound, SweepRun
from moeops.runs.samples import (
    EngineBucket,
    EngineSample,
    TelemetryBatch,
    TelemetryBucket,
    TelemetrySample,
)
from moeops.runs.services import closed_to


def level_record(*, run, round=1, **fields):
    """(LevelResult, created) keyed by (run, concurrency, request rate) and the round (1, 2, …
    of a level that runs several times); a repeat (the same key, round and body) stores
    nothing, even once the run has finished. A new round is stored as a LevelRound and the
    level's figures become those of all its rounds (domain.intervals.level_of_rounds).

    fields are LevelResult fields; request_rate None or inf means unlimited. Raises
    ValidationError naming a metric no level can have (negative, absurd, finished before
    started), and RunConflict for a key stored with another body or a new level of a finished
    run.
    """
    rate = fields.get("request_rate")
    if rate is not None and rate == float("inf"):
        fields["request_rate"] = rate = None
    problems = level_problems(fields)
    if problems:
        raise ValidationError(problems)
    key = level_key(fields.get("concurrency"), rate)
    digest = body_sha256(fields)
    what = f"level {key} of run {run.uuid}" + (f", round {round}," if round > 1 else "")
    with transaction.atomic():
        # the run's row is locked so that it cannot finish between the check and the insert
        locked = SweepRun.objects.select_for_update().get(pk=run.pk)
        level = run.levels.filter(key=key).first()
        rounds = list(level.rounds.all()) if level is not None else []
        stored = next((r for r in rounds if r.round == round), None)
        if stored is not None:
            same_body(stored, digest, what)
            return level, False
        if level is not None and not rounds and round == 1:
            # stored before rounds were, or imported: the level is its own round 1
            return same_body(level, digest, what), False
        closed_to(locked, "levels")
        log = level_request_log(fields.pop("request_log", None), fields)
        raw, attempt = fields.pop("raw", None), fields.pop("attempt", 1)
        figures = {k: v for k, v in fields.items() if k in ROUND_KEYS}
        if level is not None and not rounds:
            rounds = [level.own_round()]
        new = LevelRound(round=round, figures=figures, raw=raw, attempt=attempt, body_sha256=digest)
        rounds = sorted([*rounds, new], key=lambda r: r.round)
        try:
            with transaction.atomic():
                if level is None:
                    level = LevelResult(run=run, key=key, body_sha256=digest, attempt=attempt)
                for name, value in level_of_rounds([r.figures for r in rounds]).items():
                    setattr(level, name, value)
                level.attempt = max(level.attempt, attempt)
                level.raw = raw
                level.round_count = len(rounds)
                level.save()
                for r in rounds:
                    if r.pk is None:
                        r.level = level
                        r.save()
                if log is not None:
                    log.level, log.round = level, round
                    log.save()
        except IntegrityError:
            level = run.levels.get(key=key)
            same_body(level.rounds.filter(round=round).first() or level, digest, what)
            return level, False
    return level, True


def _profile_problems(body: LevelProfileBody) -> dict:
    """{field: sentence} of a profile whose status and content disagree."""
    if body.status == "captured" and body.breakdown is None:
        return {"breakdown": "a captured profile holds its breakdown"}
    if body.status != "captured" and body.breakdown is not None:
        return {"breakdown": f"a profile {body.status} holds no breakdown (only a captured one)"}
    if body.status != "captured" and not body.reason.strip():
        return {"reason": f"a profile {body.status} says why in its reason"}
    return {}


def profile_record(*, run, body: LevelProfileBody, source="worker"):
    """(LevelProfile, created) keyed by (run, concurrency, request rate, attempt) and source
    ("worker", or "upload" for traces read by the web tier); a repeat (the same key and body)
    stores nothing, even once the run has finished, as a level's does (level_record): a profile
    arrives after its level and before the run ends. Raises ValidationError naming the field of
    a body whose status and content disagree, and RunConflict for a key stored with another body
    or a new profile of a finished run (from the worker: an upload may come later)."""
    problems = _profile_problems(body)
    if problems:
        raise ValidationError(problems)
    key = level_key(body.concurrency, body.request_rate)
    digest = body_sha256(body.model_dump(mode="json"))
    what = f"profile of level {key} of run {run.uuid}, attempt {body.attempt},"
    with transaction.atomic():
        # the run's row is locked so that it cannot finish between the check and the insert
        locked = SweepRun.objects.select_for_update().get(pk=run.pk)
        rows = run.profiles.filter(key=key, source=source, attempt=body.attempt)
        stored = rows.first()
        if stored is not None:
            return same_body(stored, digest, what), False
        if source == "worker":
            closed_to(locked, "profiles")
        # each field of the contract is a column of its own (LevelProfile.body reads them back)
        fields = body.model_dump(mode="json", include=set(LevelProfileBody.model_fields))
        try:
            with transaction.atomic():
                profile = LevelProfile.objects.create(
                    run=run, key=key, source=source, body_sha256=digest, **fields
                )
        except IntegrityError:
            return same_body(rows.get(), digest, what), False
    return profile, True


# What a trace uploaded by hand may be called: what domain.step_trace reads, in a name short
# enough to show beside a rank's file.
TRACE_SUFFIXES = (".zip", ".json.gz", ".json")
MAX_TRACE_NAME = 200


def profile_upload(*, run, concurrency, name, chunks, size, request_rate=None):
    """(LevelProfile, created) of traces captured by hand for a level of the run: a .zip of
    rank files or one .json.gz / .json trace, of `size` bytes given as `chunks` (bytes), read
    by domain.step_trace in a temporary folder and stored as a captured profile of source
    "upload" (its trace listed as host "uploaded", path `name`). The same file again is a
    repeat; another is the level's next upload. Raises ValidationError on "file" with a
    sentence (over settings.TRACE_UPLOAD_MAX_BYTES, not a trace, TraceError's) and stores
    nothing then. An upload is taken on a finished run too: traces come after the sweep."""
    limit = settings.TRACE_UPLOAD_MAX_BYTES
    shown = os.path.basename(name.replace("\\", "/")) or "trace"
    if size > limit:
        raise ValidationError(
            {
                "file": f"{shown} is {size:,} bytes, more than the {limit:,} a trace upload may "
                "be (MOEOPS_MAX_TRACE_BYTES)"
            }
        )
    try:
        storable_text(shown)
    except ValueError as exc:
        raise ValidationError({"file": f"the file's name {exc}"}) from None
    if len(shown) > MAX_TRACE_NAME:
        raise ValidationError(
            {"file": f"the file's name is longer than {MAX_TRACE_NAME} characters"}
        )
    if not shown.endswith(TRACE_SUFFIXES) or shown.startswith("."):
        raise ValidationError(
            {"file": f"{shown} is not a trace file (.json.gz, .json) or a .zip of them"}
        )
    with tempfile.TemporaryDirectory(prefix="moeops-upload-") as folder:
        path = os.path.join(folder, shown)
        with open(path, "wb") as out:
            for chunk in chunks:
                out.write(chunk)
        try:
            # one process: the request's own; the upload's size bounds the work
            breakdown = read_breakdown(path, workers=1)
        except TraceError as exc:
            raise ValidationError({"file": str(exc).replace(f"{folder}{os.sep}", "")}) from None
    # the names the reader gives the files are the temporary folder's: shown as uploaded
    text = breakdown.model_dump_json().replace(json.dumps(f"{folder}{os.sep}")[1:-1], "")
    breakdown = StepBreakdown.model_validate_json(text)
    steps = max(sum(kind.steps for kind in rank.kinds) for rank in breakdown.ranks)
    body = LevelProfileBody(
        concurrency=concurrency,
        request_rate=request_rate,
        status="captured",
        steps_asked=max(1, min(steps, 10_000)),
        traces=[{"host": "uploaded", "path": shown, "size_bytes": size}],
        breakdown=breakdown,
    )
    key = level_key(concurrency, request_rate)
    uploads = list(run.profiles.filter(key=key, source="upload"))
    for stored in uploads:
        same = body.model_copy(update={"attempt": stored.attempt})
        if body_sha256(same.model_dump(mode="json")) == stored.body_sha256:
            return stored, False
    attempt = max((p.attempt for p in uploads), default=0) + 1
    return profile_record(
        run=run, body=body.model_copy(update={"attempt": attempt}), source="upload"
    )


# The columns that say whose a sample is: a sweep run's or a tuning run's.
OWNER_COLUMNS = ("run_id", "tuning_run_id")


def _sample_columns(model):
    """The sample table's columns but its id and owner, in model order."""
    return [
        f.column
        for f in model._meta.concrete_fields
        if not f.primary_key and f.column not in OWNER_COLUMNS
    ]


def _insert_samples(model, owner_column, owner_id, samples):
    """Insert sample rows without building model instances.

    bulk_create spends ~150 µs per telemetry row in model __init__ and value preparation
    (≈12,000 samples/s); COPY on PostgreSQL and one executemany on SQLite take a few µs.
    """
    columns = _sample_columns(model)
    values = itemgetter(*columns)
    rows = [(owner_id, *values(sample)) for sample in samples]
    table = connection.ops.quote_name(model._meta.db_table)
    names = ", ".join(connection.ops.quote_name(c) for c in [owner_column, *columns])
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            with cursor.copy(f"COPY {table} ({names}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
        else:
            marks = ", ".join(["%s"] * (len(columns) + 1))
            cursor.executemany(f"INSERT INTO {table} ({names}) VALUES ({marks})", rows)


# What a batch of each kind (TelemetryBatch.kind) stores: its samples' model, and the model of
# the sums kept of them (runs.rollup).
BATCH_MODELS = {"gpu": (TelemetrySample, TelemetryBucket), "engine": (EngineSample, EngineBucket)}


def _batch_record(*, owner, batch_id, kind, samples):
    """owner: {"run": SweepRun} or {"tuning_run": TuningRun}; kind: of BATCH_MODELS. A repeat
    (the same batch id and samples) stores nothing; RunConflict for a batch id stored with
    other samples, or a new batch of a finished run or tune."""
    model, buckets = BATCH_MODELS[kind]
    ((field, obj),) = owner.items()
    key = {**owner, "kind": kind, "batch_id": batch_id}
    digest = body_sha256(samples)
    what = f"{kind} sample batch {batch_id!r}"
    with transaction.atomic():
        # the owner's row is locked: it cannot finish between the check and the insert, and
        # two batches of one owner add to its buckets one after the other
        locked = type(obj).objects.select_for_update().get(pk=obj.pk)
        existing = TelemetryBatch.objects.filter(**key).first()
        if existing is not None:
            return same_body(existing, digest, what), False
        closed_to(locked, "samples")
        try:
            with transaction.atomic():
                batch = TelemetryBatch.objects.create(**key, count=len(samples), body_sha256=digest)
                _insert_samples(model, f"{field}_id", obj.pk, samples)
                rollup.buckets_add(buckets, owner_field=field, owner_id=obj.pk, samples=samples)
        except IntegrityError:
            # the same batch arrived twice at once; the other request stored it
            return same_body(TelemetryBatch.objects.get(**key), digest, what), False
    return batch, True


def telemetry_record(*, batch_id, samples, run=None, tuning_run=None):
    """(TelemetryBatch, created): store GPU samples of a sweep run or of a kernel tuning run
    (exactly one of the two) once per batch id.

    samples: dicts holding every TelemetrySample field but run and tuning_run (None where
    unknown).
    """
    if (run is None) == (tuning_run is None):
        raise TypeError("telemetry_record needs exactly one of run and tuning_run")
    owner = {"run": run} if run is not None else {"tuning_run": tuning_run}
    return _batch_record(owner=owner, batch_id=batch_id, kind="gpu", samples=samples)


def engine_samples_record(*, run, batch_id, samples):
    """(TelemetryBatch, created): store engine /metrics samples once per batch id.

    samples: dicts holding every EngineSample field but run (None where unknown).
    """
    return _batch_record(owner={"run": run}, batch_id=batch_id, kind="engine", samples=samples)
