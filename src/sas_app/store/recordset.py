"""Many rows in one prepared statement on PostgreSQL: the rows travel as one JSON parameter.

A multi-row ``INSERT … VALUES`` differs in its text with the number of rows, so it is compiled on
every call (SQLAlchemy's "insertmanyvalues", a quarter of a one-by-one submit's CPU in the
submitting process) and planned on every call (PostgreSQL). :func:`insert_from_json` writes the
same rows with a statement whose text never changes — ``INSERT … SELECT … FROM
jsonb_to_record(…)`` over the elements of one JSON array, in their order — so it is prepared once
per connection (:mod:`~sas_app.store.prepared`), and the client only encodes a list of dicts.

A ``None`` becomes SQL ``NULL`` in every column, JSON columns included (SQLAlchemy's JSON type
writes it as JSON ``null``; both read back as ``None``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import BigInteger, Boolean, Float, Integer, String, Table, Text, bindparam, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.sql.elements import TextClause
from sqlalchemy.types import JSON, TypeEngine

from sas_app.store.prepared import PREPARED

#: the parameter holding the rows (encoded as every JSON column is, by json.dumps)
ROWS = "b_rows"


def _sql_type(column_type: TypeEngine[Any]) -> str:
    for kind, name in ((JSON, "jsonb"), (Boolean, "boolean"), (BigInteger, "bigint"),
                       (Integer, "integer"), (Float, "double precision"), (Text, "text"), (String, "text")):
        if isinstance(column_type, kind):
            return name
    raise TypeError(f"no JSON recordset type for {column_type!r}")


def recordset(table: Table, columns: Sequence[str]) -> str:
    """The SQL ``FROM`` items reading each element of the JSON array parameter :data:`ROWS` as a
    row ``r`` of ``columns`` (typed as ``table``'s), numbered ``e.n`` in the array's order."""
    typed = ", ".join(f"{name} {_sql_type(table.c[name].type)}" for name in columns)
    return f"jsonb_array_elements(:{ROWS}) WITH ORDINALITY AS e(doc, n), jsonb_to_record(e.doc) AS r({typed})"


def insert_from_json(table: Table, columns: Sequence[str], computed: Mapping[str, str] | None = None) -> TextClause:
    """``INSERT INTO table`` of ``columns`` read from each element of the JSON array parameter
    :data:`ROWS`, plus ``computed`` columns given as SQL (the database's clock, say)."""
    computed = dict(computed or {})
    return text(
        f"INSERT INTO {table.name} ({', '.join([*columns, *computed])}) "
        f"SELECT {', '.join([*(f'r.{name}' for name in columns), *computed.values()])} "
        f"FROM {recordset(table, columns)} ORDER BY e.n"
    ).bindparams(bindparam(ROWS, type_=JSONB)).execution_options(**PREPARED)


def rows_parameter(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The statement's parameters for ``rows``."""
    return {ROWS: list(rows)}

