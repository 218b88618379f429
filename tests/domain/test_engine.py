"""domain.engine's reading of what an engine reports against its defaults."""

from domain import engine as reports


def test_differing_names_each_reported_value_that_is_not_its_default():
    reported = {"a": 4, "b": "x", "c": [1, 2], "d": None}
    defaults = {"a": 256, "b": "x", "c": [1, 2], "e": 7}
    # d is not among the defaults: reported with no default; e was not reported: not named
    assert reports.differing(reported, defaults) == {"a": 256, "d": None}
