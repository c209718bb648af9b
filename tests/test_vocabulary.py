"""The product speaks to its users: README, docs, source, tests and benchmarks carry no lab-notebook
vocabulary (numbered work sessions, issue numbers, the user reports' numbers, counted experiment
tables). How a rule or a number was found belongs in git history and CHANGELOG.md."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCANNED = (
    "README.md",
    "CHANGELOG.md",
    "docs",
    "src",
    "tests",
    "benchmarks",
    "scripts",
    "examples",
    ".ci",
    "mkdocs.yml",
)
TEXT_SUFFIXES = {
    ".py",
    ".md",
    ".txt",
    ".sh",
    ".html",
    ".css",
    ".j2",
    ".jinja",
    ".yml",
    ".yaml",
    ".toml",
    ".c",
    ".cpp",
    ".h",
    ".pbtxt",
    "",
}
NOT_SCANNED = ("benchmarks/results/",)  # raw results: data named by date and content, not prose
ORDINALS = (
    r"(?:fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|fourteenth|fifteenth|"
    r"sixteenth|seventeenth|eighteenth|nineteenth|twentieth|thirtieth|(?:twenty|thirty|forty)-[a-z]+)"
)
PATTERNS = {
    "a numbered work session": re.compile(r"\bstops? [0-9]+\b", re.IGNORECASE),
    "an issue number": re.compile(r"\bissues? #?[0-9]+\b", re.IGNORECASE),
    "a user report's number": re.compile(r"(?<!random )\bseed[- ]?[0-9]", re.IGNORECASE),
    "a counted experiment table": re.compile(
        ORDINALS + r"(?:(?: and | to |, )" + ORDINALS + r")*[ -]+(?:[A-Za-z0-9]+ )?(?:matri|table)", re.IGNORECASE
    ),
}


def scanned_files() -> list[Path]:
    files = []
    for name in SCANNED:
        top = ROOT / name
        for path in [top] if top.is_file() else sorted(top.rglob("*")) if top.is_dir() else []:
            relative = path.relative_to(ROOT).as_posix()
            if (
                path.is_file()
                and path.suffix in TEXT_SUFFIXES
                and "__pycache__" not in relative
                and not relative.startswith(NOT_SCANNED)
                and ".egg-info" not in relative
                and relative != "tests/test_vocabulary.py"
            ):
                files.append(path)
    return files


def findings(text: str) -> list[tuple[int, str, str]]:
    return [
        (text.count("\n", 0, match.start()) + 1, what, match.group(0))
        for what, pattern in PATTERNS.items()
        for match in pattern.finditer(text)
    ]


def test_the_patterns_find_each_kind_of_lab_vocabulary_and_spare_ordinary_words():
    found = findings(
        "since stop 37\nissue 18\nthe seed-2-shaped abort\nseed 1's cure\n"
        "the twenty-fifth H200 matrix\nthe twelfth to fourteenth tables\n"
    )
    assert [what for _, what, _ in found] == list(PATTERNS)[:2] + [list(PATTERNS)[2]] * 2 + [list(PATTERNS)[3]] * 2
    assert (
        findings(
            "records stop at the abort; random seed 15; the fourth column; the first table below; "
            "the matrix of LMDeploy releases; an issue tracker"
        )
        == []
    )


def test_readme_docs_source_tests_and_benchmarks_carry_no_lab_vocabulary():
    problems = [
        f"{path.relative_to(ROOT)}:{line}: {what}: {words!r}"
        for path in scanned_files()
        for line, what, words in findings(path.read_text(encoding="utf-8", errors="replace"))
    ]
    assert len(scanned_files()) > 100  # the scan reaches the tree, not an empty list
    assert not problems, f"{len(problems)} places:\n" + "\n".join(problems[:60])
