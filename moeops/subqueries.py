"""Correlated subqueries written out as SQL, for the pages that list rows with a figure of their
children (a run's peak, a tune's timings, a deployment's GPUs).

Django resolves and compiles a Subquery of an OuterRef anew for every query that holds it, and
on the dashboard and compare pages that cost more CPU than running it (bench/ui_pages.py). These
are simple enough to write once. Each names its outer row by the quoted "table"."column" of
`column`: the annotated queryset's own table, which Django leaves unaliased; they are for
annotations read from the rows, not for a queryset nested in another query (where Django
renames its tables and would not rename these)."""

from django.db import models
from django.db.models.expressions import RawSQL


def column(model, field) -> str:
    """The quoted "table"."column" of a model's field."""
    return f'"{model._meta.db_table}"."{model._meta.get_field(field).column}"'


def counted(model, field, outer) -> RawSQL:
    """How many rows of `model` have `field` (a foreign key) equal to `outer` (a column)."""
    return RawSQL(
        f"SELECT COUNT(*) FROM {_table(model)} WHERE {column(model, field)} = {outer}",
        (),
        output_field=models.IntegerField(),
    )


def largest(model, value, field, outer) -> RawSQL:
    """The largest `value` (a number) among the rows of `model` whose `field` is `outer`; None
    without any."""
    return RawSQL(
        f"SELECT MAX({column(model, value)}) FROM {_table(model)} "
        f"WHERE {column(model, field)} = {outer}",
        (),
        output_field=models.FloatField(),
    )


def newest(model, field, outer, order, value="pk", **equal) -> RawSQL:
    """The `value` (a field's name; the pk by default) of the newest row of `model` by the
    `order` fields, descending, among those where they are set, whose `field` is `outer` and
    whose other fields equal `equal`'s values; None without any. Its rows are read as "newer",
    so that `outer` may be a column of the same table."""

    def name(field_name):
        found = model._meta.pk if field_name == "pk" else model._meta.get_field(field_name)
        return f'newer."{found.column}"'

    where = [f"{name(field)} = {outer}"]
    where += [f"{name(o)} IS NOT NULL" for o in order]
    where += [f"{name(e)} = %s" for e in equal]
    by = ", ".join(f"{name(o)} DESC" for o in (*order, "pk"))
    got = None if value == "pk" else model._meta.get_field(value)
    return RawSQL(
        f"SELECT {name(value)} FROM {_table(model)} newer WHERE {' AND '.join(where)} "
        f"ORDER BY {by} LIMIT 1",
        tuple(equal.values()),
        output_field=models.IntegerField() if got is None or got.is_relation else type(got)(),
    )


def _table(model) -> str:
    return f'"{model._meta.db_table}"'
