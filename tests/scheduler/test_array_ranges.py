"""The index ranges an array keeps its waiting tasks in: subtraction and row filters work range by range, and
agree with the same operations on the indices themselves."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.models import Job
from scheduler.transitions import ranges_count, ranges_minus, ranges_parse, ranges_q, ranges_subtract


def _indices(ranges) -> set[int]:
    return {index for start, end in ranges for index in range(start, end)}


def _ranges(indices: set[int]) -> list[list[int]]:
    text = ",".join(str(index) for index in sorted(indices))
    return ranges_parse(text, count=max(indices) + 1) if indices else []


index_sets = st.sets(st.integers(min_value=0, max_value=200), max_size=80)


@given(kept=index_sets, removed=index_sets)
def test_subtracting_ranges_is_subtracting_their_indices(kept, removed):
    ranges, cuts = _ranges(kept), _ranges(removed)
    left = ranges_subtract(ranges, cuts)
    assert _indices(left) == kept - removed
    assert left == ranges_minus(ranges, removed)  # sorted, disjoint and merged like the index form
    assert all(start < end for start, end in left)
    assert all(left[i][1] < left[i + 1][0] for i in range(len(left) - 1))


def test_a_million_tasks_cancelled_as_one_range_walk_no_index():
    whole = [[0, 1_000_000]]
    assert ranges_subtract(whole, [[0, 1_000_000]]) == []
    assert ranges_subtract(whole, [[10, 999_990]]) == [[0, 10], [999_990, 1_000_000]]
    assert ranges_count(ranges_subtract(whole, ranges_parse("5,7-9", count=1_000_000))) == 1_000_000 - 4


@pytest.mark.parametrize(
    ("text", "sql_has"),
    [("3-7,9", ['array_index" >= 3', 'array_index" < 8', 'array_index" = 9']), ("0-999999", ["< 1000000"])],
)
def test_rows_are_filtered_per_range_not_per_index(text, sql_has):
    query = str(Job.objects.filter(ranges_q("array_index", ranges_parse(text, count=1_000_000))).query)
    for fragment in sql_has:
        assert fragment in query, query
    assert " IN (" not in query
