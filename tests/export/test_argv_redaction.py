"""The journal header's command line keeps no secret: every common way of passing one is redacted."""

from __future__ import annotations

import pytest

from vlmtrace.export.journal.redaction import REDACTED, redacted_argv

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
    (
        ["--otlp-endpoint", f"https://user:{SECRET}@collector:4318"],
        ["--otlp-endpoint", f"https://user:{REDACTED}@collector:4318"],
    ),
    ([f"--database=postgres://u:{SECRET}@db/x"], [f"--database=postgres://u:{REDACTED}@db/x"]),
    ([f"redis://:{SECRET}@cache:6379"], [f"redis://:{REDACTED}@cache:6379"]),
    ([f"OPENAI_API_KEY={SECRET}"], [f"OPENAI_API_KEY={REDACTED}"]),
    ([f"DB_PASSWORD={SECRET}"], [f"DB_PASSWORD={REDACTED}"]),
    ([f"GITHUB_TOKEN={SECRET}"], [f"GITHUB_TOKEN={REDACTED}"]),
    (["sk-" + SECRET], [REDACTED]),
    # A URL's query or fragment parameter, a header named like a secret, short and bare password flags
    (
        [f"https://api.example.com/v1?access_token={SECRET}&page=2"],
        [f"https://api.example.com/v1?access_token={REDACTED}&page=2"],
    ),
    (["--url", f"http://h/p?x=1&api_key={SECRET}"], ["--url", f"http://h/p?x=1&api_key={REDACTED}"]),
    ([f"https://app.example.com/cb#id_token={SECRET}"], [f"https://app.example.com/cb#id_token={REDACTED}"]),
    (["-H", f"X-Auth-Token: {SECRET}"], ["-H", f"X-Auth-Token: {REDACTED}"]),
    (["-H", f"X-Vault-Token:{SECRET}"], ["-H", f"X-Vault-Token:{REDACTED}"]),
    (["-H", f"Private-Token: {SECRET}"], ["-H", f"Private-Token: {REDACTED}"]),
    (["-p", SECRET], ["-p", REDACTED]),
    ([f"-p{SECRET}"], [f"-p{REDACTED}"]),
    (["--pass", SECRET], ["--pass", REDACTED]),
    ([f"--db-pass={SECRET}"], [f"--db-pass={REDACTED}"]),
    ([f"MYSQL_PWD={SECRET}"], [f"MYSQL_PWD={REDACTED}"]),
    ([f"--bearer={SECRET}"], [f"--bearer={REDACTED}"]),
    (["--bearer", SECRET], ["--bearer", REDACTED]),
    # Every pair of a cookie; a password holding an @
    (["-H", f"Cookie: theme=dark; session={SECRET}"], ["-H", f"Cookie: {REDACTED}"]),
    ([f"https://user:pw@{SECRET}@host/x"], [f"https://user:{REDACTED}@host/x"]),
    # A map's value under a secret's key, JSON or Python
    (
        ["--config", f'{{"model": "m", "api_key": "{SECRET}"}}'],
        ["--config", f'{{"model": "m", "api_key": "{REDACTED}"}}'],
    ),
    (["--config", f"{{'hf_token': '{SECRET}'}}"], ["--config", f"{{'hf_token': '{REDACTED}'}}"]),
    (["--config", f'{{"password": "a\\"{SECRET}"}}'], ["--config", f'{{"password": "{REDACTED}"}}']),
    # Token shapes wherever they appear, and PEM blocks
    (["--x", "ghp_" + "A1b2" * 9], ["--x", REDACTED]),
    (["--x", "github_pat_" + "A1b2" * 8], ["--x", REDACTED]),
    (["--x", "use hf_" + "aB3d" * 9 + " here"], ["--x", f"use {REDACTED} here"]),
    (["--x", "AKIAIOSFODNN7EXAMPLE"], ["--x", REDACTED]),
    (["--x", "xoxb-123456789012-abcdefABCDEF"], ["--x", REDACTED]),
    (["--x", "glpat-" + "x1Y2" * 5], ["--x", REDACTED]),
    (["--x", "AIza" + "Sy" + "A1b2C3d4" * 4 + "xyz"], ["--x", REDACTED]),
    (
        ["--x", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"],
        ["--x", REDACTED],
    ),
    (
        ["--x", f"-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn{SECRET}\n-----END OPENSSH PRIVATE KEY-----"],
        ["--x", REDACTED],
    ),
    (["--x", f"-----BEGIN EC PRIVATE KEY-----\nMHcC{SECRET}"], ["--x", REDACTED]),  # cut short: to the end
]


@pytest.mark.parametrize(("argv", "kept"), FORMS, ids=[" ".join(argv)[:40] for argv, _ in FORMS])
def test_each_form_of_a_secret_is_redacted(argv, kept):
    assert redacted_argv(["lmdeploy", "serve", *argv]) == ["lmdeploy", "serve", *kept]
    assert SECRET not in " ".join(redacted_argv(argv))


def test_ordinary_arguments_are_kept():
    argv = [
        "lmdeploy",
        "serve",
        "api_server",
        "OpenGVLab/InternVL2-8B",
        "--tp",
        "-1",
        "--session-len=4096",
        "--server-port",
        "23333",
        "--backend",
        "turbomind",
        "https://example.com/model",
        "--cache-max-entry-count",
        "0.8",
        "--otlp-endpoint",
        "http://token-service:4318",
        "http://h:443/a@b?page=2#top",
        "PWD=/home/u",
        "--bypass",
        "x",
        "--chat-template",
        '{"name": "internvl2"}',
        "--log-level",
        "INFO",
    ]
    assert redacted_argv(argv) == argv
