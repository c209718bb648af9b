"""A service started with secrets on its command line, under `vlmtrace run`: its journal header keeps the
command line with every secret redacted, and the rest as given."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from tests.hostile.cli import SOURCE

SECRET = "hunter2-s3cr3t"
# Each form follows a flag of its own, so that no form is redacted only as the value of the one before.
FORMS = [
    ["--url", f"https://api.example.com/v1?access_token={SECRET}"],
    ["--url", f"http://h/p?api_key={SECRET}"],
    ["-H", f"X-Auth-Token: {SECRET}"],
    ["-p", SECRET],
    [f"-p{SECRET}"],
    ["--pass", SECRET],
    [f"MYSQL_PWD={SECRET}"],
    ["--config", f'{{"api_key": "{SECRET}"}}'],
    ["--token-file", "ghp_" + SECRET.replace("-", "") * 3],
    ["--x", "hf_" + SECRET.replace("-", "") * 3],
    ["--x", "AKIA" + "HUNTER2S3CR3TXYZ"],
    ["--x", f"-----BEGIN RSA PRIVATE KEY-----\nMII{SECRET}\n-----END RSA PRIVATE KEY-----"],
    [f"--bearer={SECRET}"],
    ["-H", f"Cookie: theme=dark; session={SECRET}"],
    ["--db", f"postgres://user:pw@{SECRET}@db/x"],
]
KEPT = ["--tp", "2", "--server-port", "23333", "OpenGVLab/InternVL2-8B"]


@pytest.mark.lmdeploy
def test_the_journal_header_of_a_service_started_with_secrets_keeps_none(tmp_path: Path):
    arguments = [word for form in FORMS for word in form] + KEPT
    environment = {**os.environ, "PYTHONPATH": SOURCE, "VLMTRACE_SAMPLE_INTERVAL_MS": "0"}
    environment.pop("VLMTRACE_JOURNAL", None)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "vlmtrace",
            "run",
            "--journal",
            "j",
            "--",
            sys.executable,
            "-c",
            "import lmdeploy",
            *arguments,
        ],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (journal,) = (tmp_path / "j").glob("*.jsonl")
    text = journal.read_bytes()
    header = orjson.loads(text.splitlines()[0])
    assert SECRET.encode() not in text and SECRET.replace("-", "").encode() not in text
    assert header["argv"][-len(KEPT) :] == KEPT and header["argv"].count("<redacted>") >= len(FORMS) // 2
