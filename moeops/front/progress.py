"""How far a sweep or a tune has got, read from the progress its worker reports."""

import datetime as dt
import time

from domain.numbers import is_number
from domain.progress import SweepProgress, TuneProgress
from moeops.jobs import ago


def _listed(value):
    return value if isinstance(value, list) else []


def _clamp(value):
    return min(max(value, 0.0), 1.0)


def _timing(status, fraction, started, finished, now):
    """(elapsed s, estimated s left) from start/finish epochs and the fraction done."""
    if started is None:
        return None, None
    end = finished if finished is not None else now
    elapsed = max(end - started, 0.0)
    eta = None
    if status == "running" and fraction and 0 < fraction < 1:
        eta = elapsed * (1 - fraction) / fraction
    return elapsed, eta


def _span(seconds):
    seconds = max(seconds, 0.0)
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def lost_worker_text(run, now):
    """What becomes of a sweep whose worker was lost (SweepRun.worker_loss, decision 54): that
    the reaper sends it again to the host's worker come back, and resumes it, or that it is
    failed and not resumed; "" while its worker sweeps it. now: epoch s."""
    loss = run.worker_loss(dt.datetime.fromtimestamp(now, dt.UTC))
    if loss is None:
        return ""
    stopped = f"Its worker stopped sending heartbeats {ago(loss.silent_s)}"
    left = loss.fails_at - now
    if loss.resent_at is not None:
        return (
            f"{stopped}; the sweep was sent again {ago(now - loss.resent_at)} and resumes from "
            "its finished levels once the host's worker takes it"
            + (f" (it is failed in {_span(left)} if none does)." if left > 0 else ".")
        )
    if loss.back:
        return (
            f"{stopped}; the host's worker is back: the sweep is sent to it again within a "
            "minute and resumes from its finished levels."
        )
    if left <= 0:
        return f"{stopped}: it is failed within a minute, its finished levels kept, not resumed."
    return (
        f"{stopped}. If the host's worker comes back within {_span(left)}, the sweep is sent to "
        "it again and resumes from its finished levels; after that it is failed, not resumed."
    )


def _queued_text(host):
    """What a queued run waits for: its host's worker, or why that worker is not there."""
    absence = host.worker_absence() if host is not None else ""
    return f"queued: {absence}" if absence else "queued, waiting for the host's worker"


def sweep_progress(run, now=None):
    """The progress of a SweepRun as plain values for the page and the status endpoint.

    Reads `run.progress` as the worker writes it: `level_index` (0-based level running),
    `levels_total`, `round` / `rounds` (of a level run several times), `requests_done` /
    `requests_total` (of the round running), `started_at` (UTC epoch s). Returns a dict: level
    (1-based), levels_total, requests_done, requests_total, fraction (0–1), elapsed_s, eta_s
    (s, None when unknown) and text.
    """
    now = time.time() if now is None else now
    p = SweepProgress.read(run.progress)
    # runs imported before the parameters' schema hold a count under "levels", not a list
    levels = (run.parameters or {}).get("levels")
    levels_total = p.levels_total or len(_listed(levels)) or None
    level_index = p.level_index
    done, total = p.requests_done, p.requests_total
    rounds = int(p.rounds or 1)
    round_number = min(max(int(p.round or 1), 1), rounds) if rounds > 1 else 1

    search = p.capacity
    fraction = None
    if run.status == "succeeded":
        fraction = 1.0
    elif search is not None:
        # a capacity search chooses its levels as it goes: how many are left is unknown
        fraction = None
    elif levels_total and level_index is not None:
        within = _clamp(done / total) if done is not None and total else 0.0
        within = (round_number - 1 + within) / rounds
        fraction = _clamp((level_index + within) / levels_total)
    elif run.status == "queued":
        fraction = 0.0

    started = p.started_at
    if started is None and run.started_at is not None:
        started = run.started_at.timestamp()
    finished = run.finished_at.timestamp() if run.finished_at and run.is_finished else None
    elapsed, eta = _timing(run.status, fraction, started, finished, now)

    level = None
    if level_index is not None:
        level = int(level_index) + 1
        if levels_total:
            level = min(level, int(levels_total))
    parts = []
    if run.status == "queued":
        parts.append(_queued_text(run.deployment.host))
    elif level is not None:
        # a capacity search's levels are chosen as it goes: no total to count to
        parts.append(f"level {level}" if search else f"level {level} of {levels_total or '?'}")
        concurrency = p.concurrency
        if concurrency is not None:
            parts[-1] += f" (concurrency {int(concurrency)})"
        if p.more_rounds:
            # domain.capacity.needs_more_rounds: one more round until the intervals settle
            parts.append(f"round {round_number}, more as its interval straddles a limit")
        elif rounds > 1:
            parts.append(f"round {round_number} of {rounds}")
    if search is not None and run.status != "queued":
        parts.append(capacity_bracket_text(search))
    if done is not None and run.status == "running":
        parts.append(f"{int(done)} of {int(total) if total else '?'} requests")
    lost = lost_worker_text(run, now)
    text = ". ".join(part for part in (", ".join(parts), lost) if part)
    return {
        "level": level,
        "levels_total": levels_total,
        "requests_done": done,
        "requests_total": total,
        "fraction": fraction,
        "elapsed_s": elapsed,
        "eta_s": eta,
        "text": text,
        "lost": lost,
    }


def _load(value, unit):
    return f"{value:g}" if unit == "concurrent" else f"{value:.3g}"


def capacity_bracket_text(search):
    """ "tried 8 ✓, 16 ✓, 32 ✗, 24 ✗; bracket 16–24 concurrent" from a capacity search's
    progress (workers.capacity.bracket_progress): each probe as it lands, ✓ where it met the
    SLO on its intervals' upper bounds."""
    unit = search.get("unit") if search.get("unit") in ("concurrent", "req/s") else "concurrent"
    probes = [p for p in _listed(search.get("probes")) if is_number((p or {}).get("load"))]
    if not probes:
        return "no level judged yet"
    tried = ", ".join(f"{_load(p['load'], unit)} {'✓' if p.get('met') else '✗'}" for p in probes)
    low, high = (_listed(search.get("bracket")) + [None, None])[:2]
    if is_number(low) and is_number(high):
        where = f"bracket {_load(low, unit)}–{_load(high, unit)} {unit}"
    elif is_number(low):
        where = f"at least {_load(low, unit)} {unit}"
    elif is_number(high):
        where = f"below {_load(high, unit)} {unit}"
    else:
        where = "no bracket yet"
    return f"tried {tried}; {where}"


def tuning_progress(tuning_run, timings_count=0, now=None):
    """The progress of a TuningRun: done/total batch sizes (or candidates), elapsed, ETA.

    Falls back to the per-batch-size timings stored so far against the batch sizes asked for.
    """
    now = time.time() if now is None else now
    p = TuneProgress.read(tuning_run.progress)
    done, total = p.counted()
    if total is None and tuning_run.batch_sizes:
        done, total = timings_count, len(tuning_run.batch_sizes)
    fraction = None
    if tuning_run.status == "succeeded":
        fraction = 1.0
    elif total:
        fraction = _clamp(done / total)
    started = p.started_at
    finished = None
    if tuning_run.finished_at and tuning_run.status in ("succeeded", "failed", "cancelled"):
        finished = tuning_run.finished_at.timestamp()
    elapsed, eta = _timing(tuning_run.status, fraction, started, finished, now)
    text = _queued_text(tuning_run.host) if tuning_run.status == "queued" else ""
    if tuning_run.status == "running" and total:
        text = f"{int(done)} of {int(total)} done"
        if p.batch_size is not None:
            text += f", tuning M={int(p.batch_size)}"
        if p.message:
            text += f" — {p.message}"
    return {
        "done": done,
        "total": total,
        "fraction": fraction,
        "elapsed_s": elapsed,
        "eta_s": eta,
        "text": text,
    }
