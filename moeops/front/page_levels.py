"""Runs' levels read for a page from one values_list: the pages that list many runs (compare,
a deployment's) read a few of a level's 55 columns of some 120 levels, and Model.from_db builds
a deferred instance with a walk over every column."""

from django.db.models.base import ModelState

from moeops.runs.models import LevelResult


def set_levels(runs, levels, names):
    """Each run of `runs` (a list) with its levels set as its prefetched levels
    (run.levels.all()): `levels` (a LevelResult queryset, in the order the page wants) read as
    the fields or annotations `names` alone, "run_id" among them. A field not read loads when
    asked for, as on a deferred instance. Returns the runs."""
    rows = levels.filter(run__in=runs).values_list(*names)
    by_run = {run.pk: [] for run in runs}
    for row in rows:
        level = LevelResult.__new__(LevelResult)
        level.__dict__.update(zip(names, row, strict=True))
        level._state = ModelState()
        level._state.adding = False
        level._state.db = rows.db
        by_run[level.run_id].append(level)
    for run in runs:
        for level in by_run[run.pk]:
            level._state.fields_cache["run"] = run
        prefetched = run.levels.all()
        prefetched._result_cache, prefetched._prefetch_done = by_run[run.pk], True
        run._prefetched_objects_cache = {"levels": prefetched}
    return runs
