"""Table downloads: CSV for every table (``?export=csv``), XLSX where a report asks for it."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence

from django.http import HttpResponse
from django.utils.encoding import force_str

from audit.csvsafe import formula_safe_row

EXPORT_FORMATS = ("csv", "xlsx")


def table_rows(table) -> list[list[str]]:
    """Header and rows of a django-tables2 table as plain text (all rows, not one page)."""
    return [[force_str(cell) for cell in row] for row in table.as_values()]


def csv_response(rows: Iterable[Sequence], *, filename: str) -> HttpResponse:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    for row in rows:
        # Spreadsheets run cells that start with = + - @ (or tab / CR) as formulas (CSV injection): quote them.
        writer.writerow(formula_safe_row(row))
    response = HttpResponse(buffer.getvalue(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}.csv"'
    return response


def xlsx_response(rows: Iterable[Sequence], *, filename: str, sheet: str = "report") -> HttpResponse:
    from openpyxl import Workbook

    workbook = Workbook(write_only=True)
    worksheet = workbook.create_sheet(title=sheet[:31])
    for row in rows:
        worksheet.append(formula_safe_row(row))
    buffer = io.BytesIO()
    workbook.save(buffer)
    response = HttpResponse(
        buffer.getvalue(), content_type="application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
    )
    response["Content-Disposition"] = f'attachment; filename="{filename}.xlsx"'
    return response


def export_response(table, *, fmt: str, filename: str) -> HttpResponse:
    rows = table_rows(table)
    if fmt == "xlsx":
        return xlsx_response(rows, filename=filename)
    return csv_response(rows, filename=filename)
