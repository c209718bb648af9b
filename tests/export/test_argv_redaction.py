"""The journal header's command line keeps no secret: every common way of passing one is redacted."""

from __future__ import annotations

import pytest

from vlmtrace.export.journal.records import REDACTED, redacted_argv

SECRET = "hunter2-s3cr3t"

# (argv, the argv as the journal keeps it)
FORMS = [
    (["--password", SECRET], ["--password", REDACTED]),
    ([f"--password={SECRET}"], [f"--password={REDACTED}"]),
    (["--passphrase", SECRET], ["--passphrase", REDACTED]),
    ([f"--passphrase={SECRET}"], [f"--passphrase={REDACTED}"]),
    (["--token", SECRET], ["--token", REDACTED]),
    ([f"--token={SECRET}"], [f"--token={REDACTED}"]),
    (["--jwt", SECRET], ["--jwt", REDACTED]),
    ([f"--jwt={SECRET}"], [f"--jwt={REDACTED}"]),
    (["--cookie", f"session={SECRET}"], ["--cookie", REDACTED]),
    ([f"--cookie=session={SECRET}"], [f"--cookie={REDACTED}"]),
    (["--auth", f"Bearer {SECRET}"], ["--auth", REDACTED]),
    ([f"--auth=Bearer {SECRET}"], [f"--auth={REDACTED}"]),
    (["--auth-header", SECRET], ["--auth-header", REDACTED]),
    (["--api-key", SECRET], ["--api-key", REDACTED]),
    ([f"--hf-key-file={SECRET}"], [f"--hf-key-file={REDACTED}"]),
    (["--client-secret", SECRET], ["--client-secret", REDACTED]),
    ([f"--aws_secret_access={SECRET}"], [f"--aws_secret_access={REDACTED}"]),
    (["--api-keys", "sk-one", "sk-two", "--tp", "2"], ["--api-keys", REDACTED, REDACTED, "--tp", "2"]),
    (["--headers", f"Authorization=Basic {SECRET}"], ["--headers", f"Authorization={REDACTED}"]),
    (["--headers", f"Authorization: Bearer {SECRET}"], ["--headers", f"Authorization: {REDACTED}"]),
    (["--header", f"X-Api-Key: {SECRET}"], ["--header", f"X-Api-Key: {REDACTED}"]),
    (["--extra", f"Bearer {SECRET}"], ["--extra", f"Bearer {REDACTED}"]),
    ([f"--extra=Basic {SECRET}"], [f"--extra=Basic {REDACTED}"]),
    (["--otlp-endpoint", f"https://user:{SECRET}@collector:4318"], ["--otlp-endpoint", f"https://user:{REDACTED}@collector:4318"]),
    ([f"--database=postgres://u:{SECRET}@db/x"], [f"--database=postgres://u:{REDACTED}@db/x"]),
    ([f"redis://:{SECRET}@cache:6379"], [f"redis://:{REDACTED}@cache:6379"]),
    ([f"OPENAI_API_KEY={SECRET}"], [f"OPENAI_API_KEY={REDACTED}"]),
    ([f"DB_PASSWORD={SECRET}"], [f"DB_PASSWORD={REDACTED}"]),
    ([f"GITHUB_TOKEN={SECRET}"], [f"GITHUB_TOKEN={REDACTED}"]),
    (["sk-" + SECRET], [REDACTED]),
]


@pytest.mark.parametrize(("argv", "kept"), FORMS, ids=[" ".join(argv)[:40] for argv, _ in FORMS])
def test_each_form_of_a_secret_is_redacted(argv, kept):
    assert redacted_argv(["lmdeploy", "serve", *argv]) == ["lmdeploy", "serve", *kept]
    assert SECRET not in " ".join(redacted_argv(argv))


def test_ordinary_arguments_are_kept():
    argv = ["lmdeploy", "serve", "api_server", "OpenGVLab/InternVL2-8B", "--tp", "-1", "--session-len=4096",
            "--server-port", "23333", "--backend", "turbomind", "https://example.com/model", "--cache-max-entry-count", "0.8"]
    assert redacted_argv(argv) == argv
