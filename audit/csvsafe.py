"""Spreadsheet-safe cells for every CSV and XLSX export (audit records, usage reports, console tables).

A spreadsheet runs a cell whose text starts with ``=``, ``+``, ``-`` or ``@`` as a formula, and a leading tab or
carriage return can hide one (CSV / formula injection, OWASP). User-controlled text — tenant, job and user names,
user agents, audit targets — reaches these files, so such a cell is written with a leading ``'``, which makes
spreadsheets show it as text. Numbers are never changed.

Standard library only: the offline audit verifier (``audit.bundle_verifier``) applies the same rule when it compares
``records.csv`` with ``records.jsonl``.
"""

from __future__ import annotations

FORMULA_TRIGGERS = ("=", "+", "-", "@", "\t", "\r")


def formula_safe(value: object) -> object:
    """``value`` unchanged unless it is text a spreadsheet would evaluate; then the same text after a ``'``."""
    if isinstance(value, str) and value.startswith(FORMULA_TRIGGERS):
        return "'" + value
    return value


def formula_safe_row(row) -> list:
    return [formula_safe(cell) for cell in row]
