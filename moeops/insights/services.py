"""Diagnosis writes: analyze a finished run into findings and proposed plan items."""

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Max, Q
from django.utils import timezone
from django.utils.text import slugify

from domain.jobs import FINISHED_STATUSES
from moeops.fleet.models import Deployment
from moeops.insights import analysis
from moeops.insights.models import (
    FINDING_STATES,
    PLAN_STATUSES,
    Finding,
    IncompatibilityRule,
    Note,
    PlanItem,
)
from moeops.insights.rules import run_data
from moeops.insights.rules.load import client_cpu_percent
from moeops.insights.rules.regression import comparable_key
from moeops.jobs import ACTION_IN_FLIGHT
from moeops.kernels.models import KernelConfig, config_of_file, kernel_source_of
from moeops.runs import snapshots
from moeops.runs.models import SweepRun, of_the_deployment
from tuning.config_files import file_device_name

# How far back to look for the previous comparable run of a deployment.
PREVIOUS_RUNS_SCANNED = 200
# /notes/new/ is the page that creates a note: a note under that slug could never be opened
RESERVED_NOTE_SLUGS = frozenset({"new"})
NOTE_SLUG_MAX_LENGTH = Note._meta.get_field("slug").max_length


class NoteConflict(Exception):
    """A different note is stored under the slug."""


class PlanItemConflict(ValidationError):
    """The plan item's status moved since the caller read it (compare-and-set)."""


def on_run_finished(run):
    """A finished sweep run is analyzed (a finished handler, jobs.Step.ANALYZE): returns the ids
    of the findings it proposed."""
    return [finding.pk for finding in run_analyze(run=run)]


# the evidence key under which a recipe_bound deployment-wide finding keeps its run's recipe
FOUND_UNDER = "recipe"


def run_analyze(*, run) -> list[Finding]:
    """Apply every rule to a finished run and store what they find.

    Findings are upserted by (deployment, run or None, kind, key): re-analysis updates their
    numbers, never duplicates them and never changes a state a person set. Open automatic
    findings of this run, and of the deployment as a whole, that the rules no longer propose
    are removed. Plan items are proposed once, when their finding is new, and only when the
    deployment's list has no unfinished item of the same title. Returns the proposed findings.
    """
    if run.status not in FINISHED_STATUSES:
        raise ValueError(f"run {run.uuid} is {run.status}, not finished")
    if run.stands_aside():
        # the rules read the deployment's shape, GPUs, cap and recipe: not those of another
        # model, of a file measured elsewhere or of a bisection's try
        return []
    with transaction.atomic():
        # one analysis per deployment at a time: deployment-wide findings are shared by its runs
        deployment = Deployment.objects.select_for_update().get(pk=run.deployment_id)
        proposals = analysis.analyze(_gather(run, deployment))
        findings, kept = [], {"run": set(), "deployment": set()}
        for proposal in proposals:
            finding = _finding_upsert(deployment=deployment, run=run, proposal=proposal)
            findings.append(finding)
            kept[proposal.scope].add((proposal.kind, proposal.key))
        stale = Finding.objects.filter(deployment=deployment, source="auto", state="open")
        for scope, rows in (("run", stale.filter(run=run)), ("deployment", stale.filter(run=None))):
            for finding in rows:
                if (finding.kind, finding.key) not in kept[scope]:
                    finding.delete()
        plan_items_settle(deployment=deployment)
    return findings


def finding_set_state(*, finding, state, user, expected=None) -> bool:
    """Confirm, dismiss or reopen a finding, recording who did it; re-analysis keeps it.

    With `expected`, the change is a compare-and-set: it happens only while the finding is
    still in that state (nobody changed it since the page showing it). Returns whether it did.
    """
    if state not in dict(FINDING_STATES):
        raise ValueError(f"unknown finding state {state!r}")
    changes = {
        "state": state,
        "state_changed_by": user if user is not None and user.is_authenticated else None,
        "state_changed_at": timezone.now(),
        "updated": timezone.now(),
    }
    rows = Finding.objects.filter(pk=finding.pk)
    if expected is not None:
        rows = rows.filter(state=expected)
    if rows.update(**changes) != 1:
        return False
    for name, value in changes.items():
        setattr(finding, name, value)
    return True


def findings_supersede(*, deployment) -> int:
    """Close as superseded the open automatic findings made under another launch recipe (flags,
    environment, kernel configs) than the one in force: those of runs whose engine ran it, and
    the deployment-wide ones that followed from it (Proposal.recipe_bound). They describe an
    engine that no longer runs. Kept, with their state; returns how many."""
    in_force = deployment.recipe_in_force()
    if in_force is None:
        return 0
    running = snapshots.recipe_content(snapshots.recipe_record(in_force))
    open_ones = deployment.findings.filter(source="auto", state="open").select_related("run")
    stale = [
        finding.pk
        for finding in open_ones
        if (found_under := _found_under(finding)) is not None and found_under != running
    ]
    now = timezone.now()
    return Finding.objects.filter(pk__in=stale, state="open").update(
        state="superseded", state_changed_by=None, state_changed_at=now, updated=now
    )


def _found_under(finding):
    """What the recipe a finding was made under runs (snapshots.recipe_content), or None where
    it depends on none: a run's finding, its run's recipe; a deployment-wide one, the recipe
    its evidence keeps (recipe_bound proposals only)."""
    if finding.run is not None:
        record = (finding.run.snapshot or {}).get("recipe")
    else:
        record = (finding.evidence or {}).get(FOUND_UNDER)
    return snapshots.recipe_content(record) if isinstance(record, dict) else None


def _made_under_recipe_in_force(deployment, record):
    """Whether a run of this recipe record (None: no recipe recorded) ran what is in force now."""
    in_force = deployment.recipe_in_force()
    if in_force is None or not record:
        return in_force is None
    running = snapshots.recipe_record(in_force)
    return snapshots.recipe_content(record) == snapshots.recipe_content(running)


def finding_create(*, deployment, run=None, **fields) -> Finding:
    """Record a finding made by a person (analysis adds the automatic ones)."""
    return Finding.objects.create(deployment=deployment, run=run, source="human", **fields)


def _finding_upsert(*, deployment, run, proposal):
    scope_run = run if proposal.scope == "run" else None
    evidence = proposal.evidence
    recipe = (run.snapshot or {}).get("recipe")
    if scope_run is None and proposal.recipe_bound and recipe:
        # a deployment-wide finding outlives its run: it keeps the recipe it follows from
        evidence = {**evidence, FOUND_UNDER: recipe}
    fields = {
        "severity": proposal.severity,
        "title": proposal.title[:200],
        "text": proposal.text,
        "evidence": evidence,
        "note_id": proposal.note_id,
    }
    finding = Finding.objects.filter(
        deployment=deployment, run=scope_run, kind=proposal.kind, key=proposal.key
    ).first()
    if (
        finding is not None
        and finding.source == "auto"
        and finding.state == "superseded"
        and scope_run is None
        and _made_under_recipe_in_force(deployment, recipe)
    ):
        # the recipe in force shows it again: open, as a new finding would be
        fields.update(state="open", state_changed_by=None, state_changed_at=timezone.now())
    if finding is None:
        finding = Finding.objects.create(
            deployment=deployment,
            run=scope_run,
            kind=proposal.kind,
            key=proposal.key,
            source="auto",
            provenance=f"analysis of {run.display_label()}",
            **fields,
        )
        _plan_propose(deployment=deployment, finding=finding, titles=proposal.plan)
    elif finding.source == "auto":
        for name, value in fields.items():
            setattr(finding, name, value)
        finding.save(update_fields=[*fields, "updated"])
    return finding


def _plan_propose(*, deployment, finding, titles):
    for title in titles:
        title = title[:300]
        same = deployment.plan_items.filter(title=title).select_related("finding", "deployment")
        # an item of these words still to do, or one done whose change is still in force
        if any(item.status != "completed" or _in_force(item) for item in same):
            continue
        plan_item_add(
            deployment=deployment,
            title=title,
            finding=finding,
            note=finding.note,
            source="auto",
            provenance=finding.provenance,
        )


# --------------------------------------------------------------------------- the plan


def plan_item_add(
    *, deployment, title, status="pending", finding=None, note=None, source="human", provenance=""
):
    """Append an item at the end of the deployment's plan (positions 0…n-1, in order)."""
    with transaction.atomic():
        # the deployment's row serializes concurrent appends (no FOR UPDATE with an aggregate)
        Deployment.objects.select_for_update().filter(pk=deployment.pk).first()
        last = deployment.plan_items.aggregate(last=Max("position"))["last"]
        return PlanItem.objects.create(
            deployment=deployment,
            title=title,
            status=status,
            finding=finding,
            note=note,
            source=source,
            provenance=provenance,
            position=0 if last is None else last + 1,
        )


def plan_items_settle(*, deployment):
    """Mark done, with the engine action that brought it up, every item of the deployment's plan
    whose change is in force (however it got there: its own action, another one, a recipe
    edit), save those an action in flight still carries out. Returns the items marked done."""
    done = []
    items = (
        deployment.plan_items.exclude(status="completed")
        # an action in flight still carries the item out: it is done when that action ends
        .exclude(engine_actions__status__in=ACTION_IN_FLIGHT)
        .select_related("finding", "deployment")
    )
    for item in items:
        action = _in_force(item)
        if action:
            try:
                plan_item_transition(item=item, status="completed", done_by=action)
            except PlanItemConflict:
                continue  # moved since it was read (a person, an action): that move stands
            done.append(item)
    return done


def _in_force(item):
    """The engine action that put item's change in force, or None (the one rule for whether a
    plan item's change is in force: the deployment's recipe in force and its engine's report)."""
    change = item.cap_change()
    if change is None:
        return None
    cap, action = item.deployment.running_cap_in_force(change.flag)
    return action if action is not None and change.in_force(cap) else None


def plan_item_update(*, item, title=None, status=None, position=None):
    """Set an item's title and status (a move plan_item_transition makes, from the status the
    caller read); a position moves it there within its plan (0 first). Raises ValidationError
    naming status for a move the item cannot make or one it made meanwhile; nothing is saved."""
    with transaction.atomic():
        if status is not None and status != item.status:
            plan_item_transition(item=item, status=status)
        if title is not None:
            PlanItem.objects.filter(pk=item.pk).update(title=title)
            item.title = title
        if position is not None:
            _plan_reorder(item, lambda items, index: position)
    return item


def plan_item_transition(*, item, status, expected=None, done_by=None):
    """Move item to status (PlanItem.can_move_to, models.PLAN_MOVES) by compare-and-set: the
    row changes only while its status is still `expected` (default: item.status, as the caller
    read it), so of two writers that read the same status one wins. Staying where it is moves
    nothing, but checks the same.

    done_by: the engine action that put the item's change in force (completed only); a done
    item reopened, or one a person says is done, has none.

    Raises ValidationError naming status for a move PLAN_MOVES lacks, and PlanItemConflict (a
    ValidationError naming status) when the row's status is no longer `expected`, item.status
    then the row's. Returns item, moved.
    """
    expected = item.status if expected is None else expected
    names = dict(PLAN_STATUSES)
    if status not in names:
        raise ValidationError({"status": f"one of {', '.join(names)}, not {status!r}"})
    if done_by is not None and status != "completed":
        raise ValueError("only a completed plan item is done by an engine action")
    if not PlanItem(status=expected).can_move_to(status):
        raise ValidationError(
            {
                "status": f"plan item “{item.title}” is {names[expected].lower()}: it cannot "
                f"become {names[status].lower()} (reopen it as pending first)"
            }
        )
    changes = {"status": status}
    if done_by is not None:
        changes["done_by"] = done_by
    elif "completed" in (status, expected) and status != expected:
        changes["done_by"] = None
    if PlanItem.objects.filter(pk=item.pk, status=expected).update(**changes) != 1:
        now = PlanItem.objects.filter(pk=item.pk).values_list("status", flat=True).first()
        if now is None:
            raise PlanItemConflict({"status": f"plan item “{item.title}” was deleted meanwhile"})
        item.status = now
        raise PlanItemConflict(
            {
                "status": f"plan item “{item.title}” is {names[now].lower()} now, not "
                f"{names[expected].lower()}: it moved meanwhile"
            }
        )
    for name, value in changes.items():
        setattr(item, name, value)
    return item


def plan_item_delete(*, item):
    """Remove an item from its plan; the others keep their order."""
    item.delete()


def plan_item_move(*, item, offset):
    """Move an item `offset` places (-1 up, +1 down) within its plan."""
    with transaction.atomic():
        _plan_reorder(item, lambda items, index: index + offset)
    return item


# --------------------------------------------------------------------------- notes


def note_slug(*, title, slug="") -> str:
    """The slug a note goes under: `slug`, else one made from the title. ValidationError naming
    the slug when it is reserved, digits alone or too long; the form, the API and the admin all
    go by it."""
    if slug.isascii() and slug.isdigit():
        raise ValidationError(
            {"slug": f"“{slug}” is digits alone, which the API reads as a note's id: add a letter."}
        )
    made = slugify(title)
    if made.isdigit():
        # a title of digits alone ("2026") would make a slug the API reads as an id
        made = f"note-{made}"
    slug = slug or made[:NOTE_SLUG_MAX_LENGTH] or "note"
    if slug in RESERVED_NOTE_SLUGS:
        raise ValidationError({"slug": f"“{slug}” is reserved; pick another slug."})
    if len(slug) > NOTE_SLUG_MAX_LENGTH:
        raise ValidationError(
            {"slug": f"at most {NOTE_SLUG_MAX_LENGTH} characters, not {len(slug)}."}
        )
    return slug


def note_taken_refusal(*, slug, note=None) -> str:
    """Why `slug` may not be given to `note` (None: a new note), or "" when it is free."""
    if Note.objects.filter(slug=slug).exclude(pk=note.pk if note else None).exists():
        return f"A note with the slug “{slug}” exists."
    return ""


def note_create(*, title, slug="", body="", provenance="") -> tuple[Note, bool]:
    """Add a note under note_slug(); returns (note, created). The same slug with the same title
    and body is the existing note (created False); NoteConflict when a different one has it."""
    slug = note_slug(title=title, slug=slug)
    note = Note(title=title, slug=slug, body=body, provenance=provenance)
    existing = Note.objects.filter(slug=note.slug).first()
    if existing is None:
        try:
            with transaction.atomic():
                note.save()
            return note, True
        except IntegrityError:
            existing = Note.objects.get(slug=note.slug)
    if (existing.title, existing.body) != (note.title, note.body):
        raise NoteConflict(f"slug: a different note {note.slug!r} exists")
    return existing, False


def note_update(*, note, title, slug="", body, provenance=None) -> Note:
    """Change a note's title, slug (note_slug()) and body; ValidationError naming the slug
    when it is reserved or another note has it."""
    slug = note_slug(title=title, slug=slug)
    refusal = note_taken_refusal(slug=slug, note=note)
    if refusal:
        raise ValidationError({"slug": refusal})
    note.title, note.slug, note.body = title, slug, body
    if provenance is not None:
        note.provenance = provenance
    note.save()
    return note


def _plan_reorder(item, target):
    """Put item at target(items, its index) (clamped) and renumber the plan 0…n-1."""
    items = list(
        PlanItem.objects.select_for_update()
        .filter(deployment_id=item.deployment_id)
        .order_by("position", "id")
    )
    index = next(i for i, other in enumerate(items) if other.pk == item.pk)
    place = min(max(target(items, index), 0), len(items) - 1)
    items.insert(place, items.pop(index))
    for position, other in enumerate(items):
        if other.position != position:
            PlanItem.objects.filter(pk=other.pk).update(position=position)
        if other.pk == item.pk:
            item.position = position


def _gather(run, deployment) -> run_data.RunData:
    """The run's rows and the deployment's state as plain values for the rules."""
    used = list(deployment.gpus.all())
    gpus = used or list(deployment.host.gpus.all())
    names = {gpu.name for gpu in gpus}
    kernel_configs = {
        (c.device_name, c.E, c.N, c.dtype, tuple(c.block_shape) if c.block_shape else None)
        # a _down file alone does not replace the main config the engine looks for
        for c in KernelConfig.objects.filter(
            device_name__in=names | {file_device_name(n) for n in names}, down_moe=False
        ).only("device_name", "E", "N", "dtype", "block_shape")
    }
    engine = _engine(run, deployment)
    return run_data.RunData(
        run_label=run.display_label(),
        parameters=run.parameters or {},
        levels=_levels(run),
        telemetry_status=run.telemetry_status,
        telemetry_detail=run.telemetry_detail,
        gpu_samples=[
            run_data.GpuSample(*row)
            for row in run.samples_of_stored_attempts(run.telemetry)
            .order_by("ts")
            .values_list(
                "gpu_index", "ts", "level_concurrency", "gpu_util", "power_w", "power_limit_w"
            )
        ],
        engine_samples=[
            run_data.EngineSample(*row)
            for row in run.samples_of_stored_attempts(run.engine_samples)
            .order_by("ts")
            .values_list("ts", "level_concurrency", "running", "queued", "kv_cache_usage")
        ],
        engine=engine,
        recorded_engine=deployment.engine,
        observed=run.observed_engine,
        tp=deployment.tp,
        ep=deployment.ep,
        # as the run recorded it: a deployment edited since does not change what it ran under
        max_running_requests=run.recorded_running_cap(),
        launch=_launch(run, deployment),
        gpus=[run_data.Gpu(g.index, g.name, g.compute_capability, g.power_limit_w) for g in gpus],
        used_gpu_indexes=[g.index for g in used] or None,
        moe_shape=deployment.moe_shape(),
        quantization=deployment.weight_quantization,
        kernel_configs=kernel_configs,
        newest_run_tuned=_newest_run_tuned(deployment),
        tuned_file=_tuned_file(run.snapshot, engine),
        serving_kernel_sha256=kernel_source_of(engine, run.observed_engine.get("version") or ""),
        topology=_topology(run.topology_snapshot),
        previous=_previous_comparable(run),
        capacity=run.capacity,
        profiles=[p.body() for p in run.profiles.filter(status="captured").shown()],
        engine_paths=run.recorded().engine_paths,
        rules=[
            run_data.Rule(
                id=rule.pk,
                name=rule.name,
                finding_text=rule.finding_text,
                compute_capability=rule.compute_capability,
                engine=rule.engine,
                launch_argument=rule.launch_argument,
                launch_value=rule.launch_value,
                severity=rule.severity,
                note_id=rule.note_id,
            )
            for rule in IncompatibilityRule.objects.filter(enabled=True)
        ],
    )


def _engine(run, deployment):
    """The engine that answered when the sweep started, else the one on record."""
    answered = run.observed_engine.get("engine")
    return answered if answered and answered != "unknown" else deployment.engine


def _launch(run, deployment):
    """Launch arguments for the incompatibility rules: as recorded, overlaid by what the engine
    reported (its own flags win over a hand-set field). A reported dotted argument is also
    matched by its last part ("compilation_config.pass_config.fuse_allreduce_rms")."""
    launch = dict(deployment.launch_summary())
    launch["engine_version"] = deployment.engine_version
    observed = run.observed_engine
    reported = observed.get("args") or {}
    leaves = {}
    for key, value in reported.items():
        leaves.setdefault(key.rsplit(".", 1)[-1], []).append(value)
    launch.update({leaf: values[0] for leaf, values in leaves.items() if len(values) == 1})
    launch.update(reported)
    if isinstance(observed.get("allreduce_fusion"), bool):
        launch["allreduce_fusion"] = observed["allreduce_fusion"]
    if observed.get("max_running_requests"):
        launch["max_running_requests"] = observed["max_running_requests"]
    return launch


def _tuned_file(snapshot, engine):
    """The tuned file the engine loaded for the run, as the analysis reads it, or None."""
    in_effect = snapshots.tuned_file_in_effect(snapshot)
    if in_effect is None or engine not in ("vllm", "sglang"):
        return None
    config = config_of_file(
        file_name=in_effect["file_name"], sha256=in_effect["sha256"], style=engine
    )
    if config is None:
        return None
    return run_data.TunedFile(
        config_id=config.pk,
        name=str(config),
        kernel_engine=config.kernel_engine,
        kernel_version=config.kernel_version,
        kernel_source_sha256=config.kernel_source_sha256,
        untimed=config.untimed_in(engine),
    )


def _newest_run_tuned(deployment):
    newest = of_the_deployment(deployment.runs).order_by("-created", "-id").first()
    return newest is not None and newest.kernel_config_state() == "tuned"


def _topology(snapshot):
    if snapshot is None:
        return None
    return run_data.Topology(
        virtualization=snapshot.virtualization,
        technology=snapshot.virtualization_technology,
        layers=snapshot.virtualization_layers,
        links=snapshot.links,
        p2p=snapshot.p2p,
        affinity=snapshot.affinity,
        gpus=snapshot.gpus,
    )


def _levels(run):
    return [
        run_data.Level(
            concurrency=level.concurrency,
            output_throughput=level.output_throughput,
            request_rate=level.request_rate,
            max_concurrent_requests=level.max_concurrent_requests,
            requests=None if level.completed is None else level.completed + level.failed,
            started_at=level.started_at,
            finished_at=level.finished_at,
            client_cpu_percent=client_cpu_percent(level.raw, level.started_at, level.finished_at),
            completed=level.completed,
            failed=level.failed,
            all_failed_with=level.all_failed_with(),
            partial=level.is_partial,
            throughput_interval=level.interval("output_throughput"),
            throughput_rounds=tuple(
                r.figures.get("output_throughput") for r in level.stored_rounds()
            ),
            engine=level.engine_figures(),
        )
        for level in run.levels.prefetch_related("rounds")
    ]


def _previous_comparable(run):
    """The deployment's newest succeeded run before this one with the same comparable key."""
    key = comparable_key(run.parameters or {})
    if key is None:
        return None
    earlier = (
        SweepRun.objects.filter(deployment_id=run.deployment_id, status="succeeded")
        .filter(Q(created__lt=run.created) | Q(created=run.created, id__lt=run.id))
        .exclude(pk=run.pk)
        .order_by("-created", "-id")
        .only("id", "uuid", "label", "parameters", "snapshot", "created")[:PREVIOUS_RUNS_SCANNED]
    )
    for candidate in earlier:
        if comparable_key(candidate.parameters or {}) == key:
            diff = snapshots.snapshot_diff(candidate.snapshot, run.snapshot)
            return run_data.PreviousRun(
                id=candidate.pk,
                uuid=str(candidate.uuid),
                label=candidate.label,
                levels=tuple(_levels(candidate)),
                changes=tuple(snapshots.describe_change(c) for c in diff["changes"]),
                engine_moved=snapshots.engine_moved(candidate.snapshot, run.snapshot),
            )
    return None
