"""A level's metrics are the wire's (domain.wire.levels.LevelMetrics): LevelResult holds each in a
column of its kind, and every one the worker sends reaches its column."""

import pytest
from django.db import connection, models

from domain.wire.levels import COUNT_KEYS, LEVEL_KEYS, METRIC_TYPES
from moeops.runs.models import LevelResult
from tests.api_base import make_world


def test_level_result_has_a_column_for_each_metric_of_the_wire():
    for key in LEVEL_KEYS:
        column = LevelResult._meta.get_field(key)
        metric = METRIC_TYPES[key]
        assert column.null is metric.nullable, key
        if key in COUNT_KEYS:
            assert isinstance(column, models.IntegerField), key
            # the column holds the largest count the wire lets through
            _, largest = connection.ops.integer_field_range(column.get_internal_type())
            assert metric.maximum <= largest, key
        else:
            assert isinstance(column, models.FloatField), key


@pytest.mark.django_db
def test_every_metric_a_worker_sends_is_stored_in_its_column():
    world = make_world()
    run = world.run(status="running")
    # a distinct value each, so that no metric lands in another's column
    level = {key: (i + 1 if key in COUNT_KEYS else i + 0.5) for i, key in enumerate(LEVEL_KEYS)}
    answer = world.host_worker.post(f"/api/v1/runs/{run.uuid}/levels", {"concurrency": 8, **level})
    assert answer.status_code == 201, answer.json()
    stored = LevelResult.objects.get(run=run)
    assert {key: getattr(stored, key) for key in LEVEL_KEYS} == level
