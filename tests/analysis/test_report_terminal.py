"""Input text on a terminal (report/terminal.py): shown as written, never obeyed, never read as markup."""

from __future__ import annotations

import re

import pytest
from rich.table import Table

from vlmtrace.report import terminal


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain name", "plain name"),
        ("\x1b]52;c;SGVsbG8=\x07", "\\x1b]52;c;SGVsbG8=\\x07"),
        ("\x1b[2J\r\x08", "\\x1b[2J\\x0d\\x08"),
        ("C1 \x9b31m", "C1 \\x9b31m"),
        ("tab\tand newline\n escaped", "tab\\x09and newline\\x0a escaped"),
        ("ünïcode ✓ 日本", "ünïcode ✓ 日本"),
        ("evil\u202egpj.exe", "evil\\u202egpj.exe"),
        ("\u2066isolate\u2069 \u200bzero\u200dwidth\ufeff", "\\u2066isolate\\u2069 \\u200bzero\\u200dwidth\\ufeff"),
        ("line\u2028para\u2029", "line\\u2028para\\u2029"),
        ("tag\U000e0041", "tag\\U000e0041"),
        ("bytes \udcff\udc80", "bytes \\udcff\\udc80"),
    ],
)
def test_printable_escapes_what_a_terminal_would_obey_or_reorder(text, shown):
    assert terminal.printable(text) == shown


def test_a_long_name_is_cut_saying_how_much_was_left_out():
    shown = terminal.printable("\x1b" + "n" * 10_000)
    assert shown.startswith("\\x1bnnn") and shown.endswith(f"… ({10_001 - terminal.SHOWN_CHARACTERS} more characters)")
    assert len(shown) < terminal.SHOWN_CHARACTERS * 2


@pytest.mark.parametrize(
    "name",
    ["[/oops]", "[link=https://example.com]click[/link]", "[bold red]x", "\\", "end\\", ":thumbs_up: :smile:", "[/]"],
)
def test_markup_and_emoji_codes_in_input_are_shown_as_written(name):
    """As text, inside a markup string of the command's own, and in a table cell; on a colour terminal."""
    console = terminal.new_console(width=200, force_terminal=True, color_system="truecolor")
    with console.capture() as captured:
        console.print(terminal.plain(name))
        console.print(f"[red]stage[/] {terminal.escaped(name)}[dim] after[/]")
        table = Table("name")
        table.add_row(terminal.plain(name))
        console.print(table)
    text = captured.get()
    assert "\x1b]8;" not in text  # no OSC 8 hyperlink
    shown = re.sub("\x1b\\[[0-9;]*m", "", text)  # colours and weights only
    assert "\x1b" not in shown and "👍" not in shown and "😄" not in shown
    assert shown.count(name) == 3, shown
    assert "stage " + name + " after" in shown
