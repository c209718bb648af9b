"""Every documentation page that README, source, tests, benchmarks, scripts and examples point a reader to
exists: `docs/NAME.md` in a comment, a docstring, a help text or a message is a page of the docs site."""

from __future__ import annotations

import re
from pathlib import Path

from tests.test_vocabulary import ROOT, TEXT_SUFFIXES

POINTED_AT = re.compile(r"\bdocs/([a-z0-9_-]+\.md)\b")
SCANNED = ("README.md", "src", "tests", "benchmarks", "scripts", "examples", ".ci")


def _files() -> list[Path]:
    found = []
    for name in SCANNED:
        top = ROOT / name
        for path in [top] if top.is_file() else sorted(top.rglob("*")) if top.is_dir() else []:
            if (
                path.is_file()
                and path.suffix in TEXT_SUFFIXES
                and "__pycache__" not in path.parts
                and ".egg-info" not in str(path)
            ):
                found.append(path)
    return found


def test_every_docs_page_pointed_at_exists():
    missing = sorted(
        {
            f"{path.relative_to(ROOT)}: docs/{page}"
            for path in _files()
            for page in POINTED_AT.findall(path.read_text(encoding="utf-8", errors="replace"))
            if not (ROOT / "docs" / page).is_file()
        }
    )
    assert len(_files()) > 100
    assert not missing, "\n".join(missing)
