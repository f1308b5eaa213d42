"""The one table formatter (pipeline.core.table)."""

from pipeline.core.table import format_table


def test_columns_padded_to_the_widest_cell():
    assert format_table([("a", "bb", "c"), ("aaa", "b", "")]) == "a    bb  c\naaa  b"


def test_header_rule_and_right_alignment():
    out = format_table([("conc", "tok/s"), ("1", "12.5"), ("16", "180.0")], header=True, right=True)
    assert out.splitlines() == ["conc  tok/s", "----  -----", "   1   12.5", "  16  180.0"]


def test_ragged_rows_and_empty():
    assert format_table([("k", "v"), ("key",)]) == "k    v\nkey"
    assert format_table([]) == ""
