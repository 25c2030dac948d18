"""Writing and finding thousands of rows fast: the scheduling cycle (``scheduler.persist``, ``scheduler.fleet.outbox``)
and the audit trail's records at commit (``audit.services``). A leaf module (Django only), so any app may use it.

``bulk_create`` composes one statement with a parameter per value; with psycopg's client-side binding (what
Django uses) each of them is quoted in Python, about a second for the ~45,000 values of a cycle that places
3,500 jobs. On PostgreSQL ``insert_rows`` streams the rows with ``COPY`` instead (the rows go in as data, in
one round trip; row triggers fire as for INSERT). Elsewhere (SQLite, the embedded mode) it is ``bulk_create``.
Neither returns the new rows' ids: use it where nobody needs them, or give the ids, taken from the table's
sequence first with ``reserve_ids``.

``insert_instances`` and ``update_instance`` are ``Model.save`` for a few rows on a hot path (a submit, an agent's
report): the same values, each prepared by its field as ``save`` prepares it (``auto_now`` set), sent as one plain
statement. ``save`` composes its statement through the ORM each time, about half a millisecond of CPU per row. No
``pre_save``/``post_save`` signals are sent: use them only for models that have none.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db import DatabaseError, connection
from django.db.models import BooleanField, Expression, F, Model

#: Rows per INSERT where ``bulk_create`` is used (PostgreSQL takes at most 65,535 parameters per statement).
BATCH = 1000


def insert_rows(model: type[Model], columns: Sequence[str], rows: Sequence[Sequence]) -> None:
    """Insert ``rows`` (values in the order of ``columns``, which are column attnames such as ``job_id``) into
    ``model``'s table, as they are: every NOT NULL column without a database default must be given, and a
    dict or list goes to a JSON column. Runs in the caller's transaction."""
    if not rows:
        return
    if connection.vendor != "postgresql":
        model.objects.bulk_create([model(**dict(zip(columns, row, strict=True))) for row in rows], batch_size=BATCH)
        return
    from psycopg.types.json import Jsonb

    quote = connection.ops.quote_name
    sql = f"COPY {quote(model._meta.db_table)} ({', '.join(quote(c) for c in columns)}) FROM STDIN"
    # The raw psycopg cursor (Django's wrapper has no COPY): its errors are turned into Django's by hand, so
    # that a refusal by a trigger is an IntegrityError as with an INSERT.
    with connection.cursor() as cursor, connection.wrap_database_errors, cursor.cursor.copy(sql) as copy:
        for row in rows:
            copy.write_row([Jsonb(v) if isinstance(v, dict | list) else v for v in row])


def insert_instances(instances: Sequence[Model], *, returning_ids: bool = False, with_first: tuple = ()) -> None:
    """Insert unsaved ``instances`` of one model in one INSERT, as ``save()`` would (ids from the database);
    with ``returning_ids`` each instance gets its new id (``RETURNING``, PostgreSQL and SQLite ≥ 3.35).

    ``with_first`` = (sql, params): a statement that runs in the same round trip, as a ``WITH`` before the INSERT
    (PostgreSQL only; e.g. an UPDATE of another table whose rows the INSERT does not read)."""
    if not instances:
        return
    meta = instances[0]._meta
    quote = connection.ops.quote_name
    fields = [field for field in meta.concrete_fields if not field.primary_key]
    values = [value for instance in instances for value in _values_for_insert(instance, fields)]
    row = f"({', '.join(['%s'] * len(fields))})"
    sql = (
        f"INSERT INTO {quote(meta.db_table)} ({', '.join(quote(field.column) for field in fields)}) "
        f"VALUES {', '.join([row] * len(instances))}"
    )
    if returning_ids:
        sql += f" RETURNING {quote(meta.pk.column)}"
    if with_first:
        first_sql, first_params = with_first
        sql, values = f"WITH first_statement AS ({first_sql}) {sql}", [*first_params, *values]
    with connection.cursor() as cursor:
        cursor.execute(sql, values)
        ids = [row[0] for row in cursor.fetchall()] if returning_ids else [None] * len(instances)
    for instance, new_id in zip(instances, ids, strict=True):
        if new_id is not None:
            instance.pk = new_id
    mark_saved(instances)


def _values_for_insert(instance: Model, fields: Sequence) -> list[Any]:
    """``instance``'s values for ``fields`` as ``save()`` sends them on an INSERT (``auto_now_add`` set)."""
    return [field.get_db_prep_save(field.pre_save(instance, True), connection) for field in fields]


def mark_saved(instances: Iterable[Model]) -> None:
    """What ``save()`` records on an instance it inserted: no longer adding, and which database holds it."""
    for instance in instances:
        instance._state.adding = False
        instance._state.db = connection.alias


def insert_instance_with_children(parent: Model, children: Sequence[Model], *, link: str) -> None:
    """``insert_instances([parent], returning_ids=True)`` then ``insert_instances(children)`` with each child's
    foreign key ``link`` (an attname such as ``job_id``) set to the parent's new id. On PostgreSQL that is one
    statement (the parent's INSERT in a WITH, the children's selecting its id): one round trip less on a path
    that runs for every submit. Elsewhere, two."""
    if connection.vendor != "postgresql" or not children:
        insert_instances([parent], returning_ids=True)
        for child in children:
            setattr(child, link, parent.pk)
        insert_instances(children)
        return
    quote = connection.ops.quote_name
    parent_meta, child_meta = parent._meta, children[0]._meta
    parent_fields = [field for field in parent_meta.concrete_fields if not field.primary_key]
    child_fields = [field for field in child_meta.concrete_fields if not field.primary_key and field.attname != link]
    link_column = quote(child_meta.get_field(link.removesuffix("_id")).column)
    values = _values_for_insert(parent, parent_fields)
    # Each value cast to its column's type: in a VALUES list PostgreSQL would otherwise type a text literal as
    # text, which a JSON or date column refuses.
    row = "(" + ", ".join(f"%s::{field.cast_db_type(connection)}" for field in child_fields) + ")"
    for child in children:
        values += _values_for_insert(child, child_fields)
    names = [f"c{index}" for index in range(len(child_fields))]
    sql = (
        f"WITH parent AS (INSERT INTO {quote(parent_meta.db_table)} "
        f"({', '.join(quote(field.column) for field in parent_fields)}) "
        f"VALUES ({', '.join(['%s'] * len(parent_fields))}) RETURNING {quote(parent_meta.pk.column)} AS id) "
        f"INSERT INTO {quote(child_meta.db_table)} ({link_column}, "
        f"{', '.join(quote(field.column) for field in child_fields)}) "
        f"SELECT parent.id, {', '.join(f'v.{name}' for name in names)} FROM parent CROSS JOIN "
        f"(VALUES {', '.join([row] * len(children))}) AS v({', '.join(names)}) RETURNING {link_column}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, values)
        parent.pk = cursor.fetchone()[0]
    mark_saved((parent, *children))
    for child in children:
        setattr(child, link, parent.pk)


def update_instance(instance: Model, fields: Iterable[str]) -> None:
    """``instance.save(update_fields=fields)`` as one UPDATE; raises as ``save`` does when the row is gone."""
    meta = instance._meta
    quote = connection.ops.quote_name
    assignments, values = [], []
    for name in sorted(set(fields)):
        field = meta.get_field(name)
        assignments.append(f"{quote(field.column)} = %s")
        values.append(field.get_db_prep_save(field.pre_save(instance, False), connection))
    sql = f"UPDATE {quote(meta.db_table)} SET {', '.join(assignments)} WHERE {quote(meta.pk.column)} = %s"
    with connection.cursor() as cursor:
        cursor.execute(sql, [*values, instance.pk])
        if cursor.rowcount == 0:
            raise DatabaseError("Save with update_fields did not affect any rows.")


def reserve_ids(model: type[Model], count: int) -> list[int] | None:
    """``count`` new primary keys of ``model`` taken from its table's sequence in one statement (PostgreSQL), so
    rows can be sent by ``insert_rows`` with their ids known; None elsewhere (insert first, read the ids back)."""
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT nextval(pg_get_serial_sequence(%s, 'id')) FROM generate_series(1, %s)",
            [model._meta.db_table, count],
        )
        return [row[0] for row in cursor.fetchall()]


class AnyOf(Expression):
    """``<field> IN <values>`` for thousands of values: ``field = ANY(%s)`` with one array parameter on
    PostgreSQL (``filter(field__in=...)`` makes a parameter per value, and Django and psycopg spend about a
    second resolving, quoting and splitting 40,000 of them); an IN list elsewhere. Use it as a filter:
    ``Job.objects.filter(AnyOf("pk", pks))``."""

    output_field = BooleanField()
    conditional = True

    def __init__(self, field: str, values: Iterable) -> None:
        super().__init__()
        self.lhs: Any = F(field)
        self.values = list(values)

    def get_source_expressions(self) -> list:
        return [self.lhs]

    def set_source_expressions(self, exprs: list) -> None:
        (self.lhs,) = exprs

    def resolve_expression(self, query=None, allow_joins=True, reuse=None, summarize=False, for_save=False):
        clone = self.copy()
        clone.lhs = self.lhs.resolve_expression(query, allow_joins, reuse, summarize, for_save)
        return clone

    def as_sql(self, compiler, connection) -> tuple[str, list]:
        lhs, params = compiler.compile(self.lhs)
        if not self.values:
            raise EmptyResultSet
        if connection.vendor == "postgresql":
            return f"{lhs} = ANY(%s)", [*params, self.values]
        return f"{lhs} IN ({', '.join(['%s'] * len(self.values))})", [*params, *self.values]


def update_rows(
    model: type[Model],
    *,
    columns: Sequence[tuple[str, str]],
    rows: Sequence[Sequence],
    set_sql: str,
    set_params: Sequence = (),
    where_sql: str = "",
) -> int:
    """``UPDATE <table> SET <set_sql> FROM <rows> AS v(<columns>) WHERE <table>.id = v.id <where_sql>``: many rows,
    each with its own values, in one statement. ``columns`` are ``(name, SQL type)`` pairs, the first the row's
    id; ``set_sql`` reads them as ``v.<name>`` and may take ``set_params``. On PostgreSQL the rows go in as one
    array per column (``unnest``), elsewhere as a VALUES list, ``BATCH`` rows a statement. (``bulk_update``
    builds a CASE per column that the database evaluates row by row: quadratic, seconds for a few thousand
    rows.) Returns the number of rows updated."""
    if not rows:
        return 0
    table = connection.ops.quote_name(model._meta.db_table)
    names = ", ".join(name for name, _type in columns)
    where = f"WHERE {table}.id = v.id {where_sql}"
    if connection.vendor == "postgresql":
        arrays = ", ".join(f"%s::{sql_type}[]" for _name, sql_type in columns)
        sql = f"UPDATE {table} SET {set_sql} FROM unnest({arrays}) AS v({names}) {where}"
        with connection.cursor() as cursor:
            # The SET clause comes first in the text, then the arrays.
            cursor.execute(sql, [*set_params, *([row[i] for row in rows] for i in range(len(columns)))])
            return cursor.rowcount
    placeholders = "(" + ", ".join(f"CAST(%s AS {sql_type})" for _name, sql_type in columns) + ")"
    updated = 0
    for start in range(0, len(rows), BATCH):
        chunk = rows[start : start + BATCH]
        # A CTE names the VALUES columns (SQLite 3.33+ has UPDATE ... FROM).
        values = ", ".join([placeholders] * len(chunk))
        sql = f"WITH v({names}) AS (VALUES {values}) UPDATE {table} SET {set_sql} FROM v {where}"
        with connection.cursor() as cursor:  # the VALUES come first in the text, then the SET clause
            cursor.execute(sql, [*(value for row in chunk for value in row), *set_params])
            if cursor.rowcount < 0:  # Python's sqlite3 counts no rows for a statement that starts with WITH
                cursor.execute("SELECT changes()")
                updated += cursor.fetchone()[0]
            else:
                updated += cursor.rowcount
    return updated
