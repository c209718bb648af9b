"""Text from an input (a span name, a stage, a device, a path, a message) on a terminal: shown, never
obeyed, never read as markup.

Every command's console comes from `new_console()`, and every input string reaches it through `plain()` (a
rich `Text`, which rich never parses for markup) or, inside a markup string of the command's own,
through `escaped()`. Both pass it through `printable()` first, which writes as an escape every
character a terminal acts on or that reorders what follows it: C0 and C1 controls (ESC, BEL, CSI,
OSC…, tab and newline too: a name stays on its line), DEL, format characters (the bidirectional
overrides U+202A-U+202E and isolates U+2066-U+2069, zero-width characters), the line and
paragraph separators, and the lone surrogates that stand for a file name's undecodable bytes; and cuts it at SHOWN_CHARACTERS, saying how many were left out (a name a
megabyte long is one line, not a screenful). rich's `:name:` emoji codes are off, so no input text
turns into an emoji.
"""

from __future__ import annotations

import unicodedata
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.text import Text

_SHOWN_AS_ESCAPE = {"Cc", "Cf", "Cs", "Zl", "Zp"}
SHOWN_CHARACTERS = 500


def _escape(character: str) -> str:
    code = ord(character)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: object) -> str:
    """`text` with every control, format and line-separator character written as an escape (`\\x1b`,
    `\\u202e`), cut at SHOWN_CHARACTERS."""
    shown = str(text)
    cut = len(shown) - SHOWN_CHARACTERS
    if cut > 0:
        shown = shown[:SHOWN_CHARACTERS]
    if not (shown.isascii() and shown.isprintable()):
        shown = "".join(_escape(c) if unicodedata.category(c) in _SHOWN_AS_ESCAPE else c for c in shown)
    return f"{shown}… ({cut} more characters)" if cut > 0 else shown


def plain(text: object, style: str = "") -> Text:
    """Input text as a rich `Text` in `style`: printable, and never parsed as markup."""
    return Text(printable(text), style=style)


def escaped(text: object) -> str:
    """Input text to put inside a markup string of one's own: printable, its brackets escaped."""
    return escape(printable(text))


def new_console(**options: Any) -> Console:
    """A rich console for a command's output: rich's options, with `:name:` emoji codes left as written."""
    return Console(emoji=False, **options)
