"""What looks like a secret in a value the journal or a log keeps: the command line in the journal's header
(docs/journal.md, Who can read it), an OTLP endpoint shown by `vlmtrace doctor`."""

from __future__ import annotations

import re
from collections.abc import Sequence

REDACTED = "<redacted>"
# Words that make a flag or a variable name a secret's: `--api-keys`, `--hf-token=...`, `--passphrase`,
# `--pass`, `--jwt`, `--cookie`, `--bearer`, `--auth`/`--auth-header`, `DB_PASSWORD=...`, `MYSQL_PWD=...`,
# `AWS_SECRET_ACCESS_KEY=...`.
_SECRET_WORD = (
    r"(?:key|token|passw|passphrase|secret|credential|jwt|cookie|bearer|(?:^|[-_.])auth"
    r"|(?:^|[-_.])pass(?:$|[-_.])|[-_.]pwd(?:$|[-_.]))"
)
_SECRET_FLAG = re.compile(rf"^--?[\w.-]*{_SECRET_WORD}[\w.-]*$|^-p$", re.IGNORECASE)
_SECRET_NAME = re.compile(rf"^[A-Za-z_][\w.-]*{_SECRET_WORD}[\w.-]*$|^auth[\w.-]*$", re.IGNORECASE)
_ATTACHED_PASSWORD = re.compile(r"^-p(?!-)\S")  # mysql's `-pSECRET`
_SECRET_VALUE = re.compile(r"^sk-|=sk-", re.IGNORECASE)
# Token shapes, wherever they appear: OpenAI, GitHub, Hugging Face, GitLab, Slack, Google API keys, AWS
# access key ids, JSON web tokens.
_TOKEN = re.compile(
    r"\b(?:sk-[\w-]{16,}|gh[pousr]_\w{20,}|github_pat_\w{20,}|hf_[A-Za-z0-9]{20,}|glpat-[\w-]{20,}|xox[abprs]-[\w-]{10,}"
    r"|AIza[\w-]{35,}|(?:AKIA|ASIA)[0-9A-Z]{16}|eyJ[\w-]{8,}\.[\w-]{8,}\.[\w-]+)"
)
_KEY_WORD = r"(?:key|token|passw|pwd|secret|credential|jwt|auth|cookie|bearer|signature|session)"
# Secrets inside any value: a PEM block; an HTTP authorization or cookie header's value (every pair of a
# cookie); a header named like a secret (`X-Auth-Token:`); `Bearer`/`Basic` credentials; the password of a
# URL (`https://user:pw@host`, `postgres://u:p@ss@db`); a URL's query or fragment parameter named like a
# secret (`?access_token=`, `&api_key=`); a JSON or Python map's value under such a key (`{"api_key": ...}`).
_SECRETS_INSIDE = (
    (re.compile(r"-----BEGIN [A-Z0-9 ]+-----.*?(?:-----END [A-Z0-9 ]+-----|$)", re.DOTALL), REDACTED),
    (re.compile(r"\b((?:proxy-)?authorization|(?:set-)?cookie)(\s*[:=]\s*)[^\n]+", re.IGNORECASE), rf"\1\2{REDACTED}"),
    (re.compile(r"\b(x-api-key|api-key)(\s*[:=]\s*)[^,;\n]+", re.IGNORECASE), rf"\1\2{REDACTED}"),
    (
        re.compile(
            rf"\b([\w-]*{_KEY_WORD}[\w-]*\s*:\s+|x-[\w-]*{_KEY_WORD}[\w-]*\s*:\s*)(?![\"'{{\[])[^,;\n]+", re.IGNORECASE
        ),
        rf"\1{REDACTED}",
    ),
    (re.compile(r"\b(bearer|basic|digest|token)(\s+)[^\s,;\"']+", re.IGNORECASE), rf"\1\2{REDACTED}"),
    (re.compile(r"\b([a-z][a-z0-9+.-]*://[^/@\s:]*):[^/?#\s]*@", re.IGNORECASE), rf"\1:{REDACTED}@"),
    (re.compile(rf"([?&#;][\w.-]*{_KEY_WORD}[\w.-]*=)[^&#\s]*", re.IGNORECASE), rf"\1{REDACTED}"),
    (
        re.compile(rf"([\"'])([^\"'\n]*{_KEY_WORD}[^\"'\n]*)\1(\s*:\s*)([\"'])(?:\\.|(?!\4)[^\\])*\4", re.IGNORECASE),
        rf"\1\2\1\3\4{REDACTED}\4",
    ),
    (_TOKEN, REDACTED),
)


def redacted_argv(argv: Sequence[str]) -> list[str]:
    """The command line with what looks like a secret replaced: the values after a flag named like a
    key, token, password (`--pass`, `-p`, mysql's `-pSECRET`), passphrase, secret, credential, JWT,
    cookie, bearer or auth (up to the next flag), `--flag=value` and `NAME=value` forms of those, and
    inside any value what _SECRETS_INSIDE lists: headers, credentials, URL passwords and parameters, map
    values under a secret's key, PEM blocks and known token shapes. The journal is a file that outlives
    the process; the command line is not."""
    redacted = []
    after_secret_flag = False
    for arg in argv:
        text = str(arg)
        flag, equals, _value = text.partition("=")
        if text.startswith("-") and len(text) > 1 and not _looks_negative_number(text):
            after_secret_flag = bool(_SECRET_FLAG.match(flag))
            if equals and (after_secret_flag or _SECRET_VALUE.search(text)):
                text = f"{flag}={REDACTED}"
            elif _ATTACHED_PASSWORD.match(text):
                text = f"-p{REDACTED}"
            after_secret_flag = after_secret_flag and not equals
        elif after_secret_flag:
            text = REDACTED
        elif equals and (_SECRET_NAME.match(flag) or _SECRET_VALUE.search(text)):
            text = f"{flag}={REDACTED}"
        elif _SECRET_VALUE.search(text):
            text = REDACTED
        redacted.append(redacted_text(text))
    return redacted


def redacted_text(text: str) -> str:
    """`text` with the secrets _SECRETS_INSIDE finds replaced (a URL's password and secret parameters, a
    header's value, token shapes…): for a value shown or kept, such as an OTLP endpoint."""
    for pattern, replacement in _SECRETS_INSIDE:
        text = pattern.sub(replacement, text)
    return text


def _looks_negative_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
