"""Two versions of one kernel config file, tuned under different routings, side by side under
each routing where both were timed (issue 42): whether the file tuned for a skew beats the one
tuned for uniform traffic under that skew, and what it gives up under uniform."""

from dataclasses import dataclass
from statistics import geometric_mean

from tuning.tune_results import routing_label


@dataclass(frozen=True)
class RoutingRow:
    """One batch size's times (µs): each file under each of the two tunes' routings."""

    batch_size: int
    this_under_this: float | None
    other_under_this: float | None
    this_under_other: float | None
    other_under_other: float | None


@dataclass(frozen=True)
class RoutingSideBySide:
    other: object  # the other version's KernelConfig
    this_label: str
    other_label: str
    rows: list[RoutingRow]

    def summaries(self) -> list[str]:
        """Per routing timed for both files: how the file tuned for it compares with the
        other file there ("Under Zipf 1.2 the file tuned for it (v4) is 1.019× as fast as v3
        in geomean; best 1.076× at M=24, worst 0.995× at M=2")."""
        said = []
        other_name = f"v{self.other.version}"
        pairs = (
            (self.this_label, "this_under_this", "other_under_this", "this file", other_name),
            (self.other_label, "other_under_other", "this_under_other", other_name, "this file"),
        )
        for label, tuned_for, against, tuned_name, against_name in pairs:
            ratios = [
                (getattr(row, against) / getattr(row, tuned_for), row.batch_size)
                for row in self.rows
                if getattr(row, against) and getattr(row, tuned_for)
            ]
            if not ratios:
                continue
            best, worst = max(ratios), min(ratios)
            said.append(
                f"Under {label} the file tuned for it ({tuned_name}) is "
                f"{geometric_mean([r for r, _ in ratios]):.3f}× as fast as {against_name} in "
                f"geomean over {len(ratios)} batch sizes; best {best[0]:.3f}× at M={best[1]}, "
                f"worst {worst[0]:.3f}× at M={worst[1]}."
            )
        return said


def _other_under(timing) -> tuple[str, float | None]:
    if not timing.also_under:
        return "", None
    return routing_label(timing.also_under["routing"]), timing.also_under.get("tuned_us")


def routing_side_by_side(tuning, timings, versions) -> RoutingSideBySide | None:
    """This tune's file (its `timings`) beside the newest other version of the same file
    whose tune ran under another routing, with each file's times under both routings where
    the tunes timed them (a tune's own routing, and its `also_under` one); None where no such
    version is."""
    if tuning is None:
        return None
    this_label = tuning.routing_label
    for other in versions:
        if other.pk == tuning.result_id:
            continue
        other_tuning = next(iter(other.tuning_runs.all()), None)
        if other_tuning is None or other_tuning.routing_label == this_label:
            continue
        other_label = other_tuning.routing_label
        theirs = {t.batch_size: t for t in other_tuning.timings.all()}
        rows = []
        for mine in timings:
            their = theirs.get(mine.batch_size)
            if their is None:
                continue
            mine_label, mine_other_us = _other_under(mine)
            their_label, their_other_us = _other_under(their)
            rows.append(
                RoutingRow(
                    batch_size=mine.batch_size,
                    this_under_this=mine.tuned_us,
                    other_under_this=their_other_us if their_label == this_label else None,
                    this_under_other=mine_other_us if mine_label == other_label else None,
                    other_under_other=their.tuned_us,
                )
            )
        if rows:
            return RoutingSideBySide(other, this_label, other_label, rows)
    return None
