"""A capacity search as the GPU-host worker runs it, inside workers.sweep.run_sweep: the next load
from domain.capacity.next_load, each level run `rounds` times and pushed round by round as a
sweep's are, until the search ends. The bracket goes into the run's progress ("capacity") as
each probe lands, so that the run page shows it narrowing.

A level whose intervals straddle a limit after its rounds (it fails on its upper bounds, meets
on its medians) runs more rounds, one at a time, until they no longer straddle or it has run
domain.intervals.MAX_ROUNDS (domain.capacity.needs_more_rounds).

A resumed search reads the levels stored before: those with all their rounds are probes as
they are, a level cut short (its rounds, or the more rounds a straddling level was running)
runs the rest."""

import asyncio
import logging

from domain.capacity import (
    bracket,
    ended,
    limits_of,
    needs_more_rounds,
    next_load,
    probe_of,
    search_of,
)
from domain.intervals import level_of_rounds
from domain.levels import DEFAULT_PROMPTS_PER_STREAM
from workers import loadgen

log = logging.getLogger(__name__)

# A request-rate level sends the requests of this many seconds at its rate (at least
# MIN_RATE_PROMPTS), so that the Poisson arrivals average out.
RATE_LEVEL_S = 30.0
MIN_RATE_PROMPTS = 16
# A request-rate level keeps at most this many requests in flight unless the run says otherwise
# (max_concurrency): the arrivals, not the streams, set the load.
RATE_MAX_CONCURRENCY = 1024


def level_at(config, search, load, index, max_concurrency=None):
    """The LevelConfig of the search's level at `load` (a concurrency, or req/s); config: the
    run's loadgen.SweepConfig, whose burstiness and ramp-up shape a rate level's arrivals."""
    if search.mode == "concurrency":
        concurrency, rate = int(load), None
        prompts = config.prompts_per_level or DEFAULT_PROMPTS_PER_STREAM * concurrency
    else:
        concurrency = int(max_concurrency or RATE_MAX_CONCURRENCY)
        rate = float(load)
        prompts = config.prompts_per_level or max(MIN_RATE_PROMPTS, round(rate * RATE_LEVEL_S))
    # the run's arrivals at every rate tried: a bursty workload's capacity is its own
    return config.level(concurrency, rate, prompts, index, arrivals=rate is not None)


def run_round(config, level, round_number, progress, should_stop):
    """Round `round_number` of level, sent by that round's client of the sweep `config`: the
    load generator's result; progress' requests_done counts the requests as they finish (a
    sweep's levels and a capacity search's probes run alike)."""
    return asyncio.run(
        loadgen.run_level(
            config.round_client(round_number),
            level,
            on_request_done=lambda n, total: progress.update(requests_done=n),
            should_stop=should_stop,
        )
    )


def load_of(mode, level):
    """The load a level (a dict of its fields) ran at: its concurrency, or its rate (req/s)."""
    return level.get("concurrency") if mode == "concurrency" else level.get("request_rate")


def bracket_progress(search, probes):
    """What the run's progress says of the search so far: each probe's load and verdicts, the
    bracket, the answer on medians, and why it ended (None while it goes on)."""
    return {
        "mode": search.mode,
        "unit": search.unit,
        "probes": [
            {"load": p.load, "met": p.met, "met_on_medians": p.met_on_medians} for p in probes
        ],
        "bracket": list(bracket(probes)),
        "load_on_medians": bracket(probes, on_medians=True)[0],
        "end": ended(search, probes),
    }


def stored_probes(parameters, stored_levels, rounds):
    """({load: stored level}, the probes of the levels that ran all their rounds, in the order
    they ran) of a resumed search; stored_levels: the run's levels as the API lists them."""
    search = search_of(parameters)
    limits, max_failed = limits_of(parameters)
    stored = {}
    for level in stored_levels:
        load = load_of(search.mode, level)
        if load is not None and not (level.get("raw") or {}).get("stopped"):
            stored[load] = level
    finished = sorted(
        (lv for lv in stored.values() if len(lv.get("rounds") or [1]) >= rounds),
        key=lambda lv: lv.get("started_at") or 0.0,
    )
    probes = []
    for level in finished:
        probe = probe_of(limits, max_failed, load_of(search.mode, level), level)
        if needs_more_rounds(probe, len(level.get("rounds") or [1])):
            # cut while it ran more rounds: the last level stored, and the next to run
            break
        probes.append(probe)
    return stored, probes


def run_search(config, parameters, stored_levels, progress, samples, push_round, stops):
    """Run the search's levels, each round pushed by push_round(result, round_number) (which
    returns the API's answer: the level of its rounds so far); samples: the run's sweep._Samples,
    tagged with each level's concurrency while it runs; returns (final status, error)
    as workers.sweep's level loop does, (None, "") when another delivery took the run over.
    stops: the callables (cancelled, out_of_time, taken_over)."""
    cancelled, out_of_time, taken_over = stops
    search = search_of(parameters)
    limits, max_failed = limits_of(parameters)
    stored, probes = stored_probes(parameters, stored_levels, config.rounds)

    def should_stop():
        return cancelled() or out_of_time()

    progress.update(rounds=config.rounds, capacity=bracket_progress(search, probes))
    while (load := next_load(search, probes)) is not None:
        level = level_at(config, search, load, len(probes), parameters.get("max_concurrency"))
        before = stored.get(load) or {}
        done = set(before.get("rounds") or [])
        results, answer, probe = [], None, None
        round_number = 0
        # the run's rounds, then one more at a time while the level straddles a limit (probe
        # is judged from the run's last round on)
        while round_number < config.rounds or needs_more_rounds(probe, round_number):
            round_number += 1
            if round_number not in done:
                if should_stop():
                    return _stopped(cancelled)
                progress.update(
                    level_index=len(probes),
                    levels_total=len(probes) + 1,
                    concurrency=level.concurrency,
                    request_rate=level.request_rate,
                    round=round_number,
                    rounds=max(round_number, config.rounds),
                    more_rounds=round_number > config.rounds,
                    requests_done=0,
                    requests_total=level.num_prompts,
                )
                samples.tag(level.concurrency)
                result = run_round(config, level, round_number, progress, should_stop)
                samples.tag(None)
                if taken_over():
                    return None, ""
                if result["stopped"]:
                    if result["completed"] or result["failed"]:
                        push_round(result, round_number)
                    return _stopped(cancelled)
                answer = push_round(result, round_number)
                results.append(result)
            if round_number >= config.rounds:
                # a level resumed part-way is the API's level of all its rounds (when it
                # answered); the stored level where every round had run before
                whole = done and isinstance(answer, dict) and "intervals" in answer
                figures = answer if whole else (level_of_rounds(results) if results else before)
                probe = probe_of(limits, max_failed, load, figures)
        probes.append(probe)
        progress.update(levels_done=len(probes), capacity=bracket_progress(search, probes))
    if taken_over():
        return None, ""
    return "succeeded", ""


def _stopped(cancelled):
    if cancelled():
        return "cancelled", ""
    return "failed", "the capacity search ran out of time; the finished levels are kept"
