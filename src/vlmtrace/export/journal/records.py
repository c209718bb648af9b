"""The journal's records (docs/journal.md): how each kind is built and encoded as one JSON line.

Every writer of journal records goes through these builders: the recorder for vlmtrace's own spans,
the span processor for other instrumentations' SDK spans, and the writer for its bookkeeping.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import orjson

FORMAT_VERSION = 2

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
_NONE: tuple = ()


class Later:
    """An attribute value worked out off the request path, when the journal's thread encodes the record
    (or the SDK's span gets its attributes at the end): `work(*inputs)`, from small objects the span's code
    took while they were alive (a tensor of counts, never pixel data). None where `work` fails."""

    __slots__ = ("inputs", "work")

    def __init__(self, work: Callable[..., Any], *inputs: Any) -> None:
        self.work = work
        self.inputs = inputs

    def value(self) -> Any:
        try:
            return self.work(*self.inputs)
        except Exception:  # noqa: BLE001 - an attribute that cannot be worked out is left empty, never raised
            return None


def resolved(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """`attributes` with every `Later` value worked out (for the SDK's span)."""
    return {key: value.value() if type(value) is Later else value for key, value in attributes.items()}


def _encodable(value: Any) -> Any:
    return value.value() if type(value) is Later else str(value)


def encode(record: Mapping[str, Any] | tuple) -> bytes:
    """One `\\n`-terminated JSON line, from a record or from a span's fields as the recorder queued them (a
    tuple: the builder, then its arguments); `Later` values are worked out here; values orjson cannot encode
    (ints past 64 bits, odd types) become strings."""
    if type(record) is tuple:
        record = record[0](*record[1:])
    try:
        return orjson.dumps(record, default=_encodable, option=orjson.OPT_APPEND_NEWLINE)
    except TypeError:
        return orjson.dumps(_stringify_unencodable(record), default=_encodable, option=orjson.OPT_APPEND_NEWLINE)


def _stringify_unencodable(value: Any) -> Any:
    if type(value) is Later:
        return _stringify_unencodable(value.value())
    if isinstance(value, Mapping):
        return {str(k): _stringify_unencodable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_stringify_unencodable(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**64:
        return str(value)
    return value


def hex_links(contexts: Iterable[Any] | None) -> list[dict[str, str]] | tuple[()]:
    """The span contexts a span links to; most spans have none, and then no list is allocated."""
    if not contexts:
        return _NONE  # orjson writes a tuple as []
    return [{"trace_id": "%032x" % c.trace_id, "span_id": "%016x" % c.span_id} for c in contexts]


def start_record(
    t: int,
    trace_hex: str,
    span_hex: str,
    parent_hex: str | None,
    name: str,
    kind: str,
    thread: str,
    attrs: Mapping[str, Any],
    mem: Mapping[str, Any],
    links: Any,
) -> dict[str, Any]:
    """A span started: `attrs` known at start (copied: the span goes on changing its own, and the record may
    be encoded later), `mem` the memory reading at start (a mapping nobody changes; empty where none)."""
    return _start(t, trace_hex, span_hex, parent_hex, name, kind, thread, dict(attrs), mem, links)


def _start(
    t: int,
    trace_hex: str,
    span_hex: str,
    parent_hex: str | None,
    name: str,
    kind: str,
    thread: str,
    attrs: Mapping[str, Any],
    mem: Mapping[str, Any],
    links: Any,
) -> dict[str, Any]:
    return {
        "k": "start",
        "t": t,
        "trace_id": trace_hex,
        "span_id": span_hex,
        "parent_id": parent_hex,
        "name": name,
        "kind": kind,
        "thread": thread,
        "attrs": attrs,
        "mem": mem,
        "links": links,
    }


def end_record(
    t: int,
    start: int,
    trace_hex: str,
    span_hex: str,
    parent_hex: str | None,
    name: str,
    kind: str,
    status: str,
    status_message: str | None,
    attrs: Mapping[str, Any],
    mem: Mapping[str, Any],
    mem0: Mapping[str, Any] | None,
    events: Any,
    links: Any,
) -> dict[str, Any]:
    """A span ended. `mem0`: the reading at start, given only where it is another reading than `mem`
    (on TurboMind most spans start and end on one sample)."""
    record = {
        "k": "end",
        "t": t,
        "start": start,
        "trace_id": trace_hex,
        "span_id": span_hex,
        "parent_id": parent_hex,
        "name": name,
        "kind": kind,
        "status": status,
        "status_message": status_message,
        "attrs": attrs,
        "mem": mem,
        "events": events,
        "links": links,
    }
    if mem0 is not None:
        record["mem0"] = mem0
    return record


def start_from_ids(
    t: int,
    trace_id: int,
    span_id: int,
    parent_id: int | None,
    name: str,
    kind: str,
    thread: str,
    attrs: Mapping[str, Any],
    mem: Mapping[str, Any],
    links: Any,
) -> dict[str, Any]:
    """A `start` record from the span's ids as ints and its links as span contexts: built where it is
    encoded, off the request path (the recorder queues `(start_from_ids, t, ...)`; `attrs` already a copy)."""
    return _start(
        t,
        "%032x" % trace_id,
        "%016x" % span_id,
        None if parent_id is None else "%016x" % parent_id,
        name,
        kind,
        thread,
        attrs,
        mem,
        hex_links(links),
    )


def end_from_ids(
    t: int,
    start: int,
    trace_id: int,
    span_id: int,
    parent_id: int | None,
    name: str,
    kind: str,
    status: str,
    status_message: str | None,
    attrs: Mapping[str, Any],
    mem: Mapping[str, Any],
    mem0: Mapping[str, Any] | None,
    events: Any,
    links: Any,
) -> dict[str, Any]:
    """An `end` record from the span's ids as ints, its events and links as the span has them (see
    `start_from_ids`)."""
    return end_record(
        t,
        start,
        "%032x" % trace_id,
        "%016x" % span_id,
        None if parent_id is None else "%016x" % parent_id,
        name,
        kind,
        status,
        status_message,
        attrs,
        mem,
        mem0,
        event_list(events),
        hex_links(links),
    )


def event_list(events: Iterable[Any] | None) -> list[dict[str, Any]] | tuple[()]:
    """Span events ({name, t, attrs}); any object with `name`, `timestamp` and `attributes`."""
    if not events:
        return _NONE
    return [{"name": e.name, "t": e.timestamp, "attrs": dict(e.attributes or {})} for e in events]


def sample_record(t: int, attrs: Mapping[str, Any]) -> dict[str, Any]:
    return {"k": "sample", "t": t, "attrs": attrs if isinstance(attrs, dict) else dict(attrs)}


def capture_record(
    start: int,
    components: list[str],
    tool: str,
    reason: str,
    requests: int,
    seconds: float,
    stopped_by: str,
    rate_at_start: float | None,
    snapshot: str | None,
    sites: list[dict],
    sites_left_out: int,
    bytes_left_out: int,
) -> dict[str, Any]:
    """A capture window's allocation sites (vlmtrace/capture/; docs/capture.md): what the window allocated and
    kept, grouped by site, largest first. `snapshot`: the torch snapshot's file name, beside the journal."""
    return {
        "k": "capture",
        "t": time.time_ns(),
        "start": start,
        "components": components,
        "tool": tool,
        "reason": reason,
        "requests": requests,
        "seconds": round(seconds, 3),
        "stopped_by": stopped_by,
        "rate_at_start": rate_at_start,
        "snapshot": snapshot,
        "sites": sites,
        "sites_left_out": sites_left_out,
        "bytes_left_out": bytes_left_out,
    }


def warning_record(source: str, message: str) -> dict[str, Any]:
    return {"k": "warning", "t": time.time_ns(), "source": source, "message": message}


def dropped_record(otlp_spans: int, journal_records: int) -> dict[str, Any]:
    return {"k": "dropped", "t": time.time_ns(), "otlp_spans": otlp_spans, "journal_records": journal_records}


def disk_full_record(path: str) -> dict[str, Any]:
    """The journal stopped because its file system is full; later records are only counted (`dropped`)."""
    return {"k": "disk_full", "t": time.time_ns(), "path": path}


def end_marker_record(clean: bool, spans_started: int, spans_ended: int, ended_by: str | None) -> dict[str, Any]:
    """The journal's last record. `ended_by`: the signal that ended the process ("SIGTERM"), or "uncaught
    NAME"; absent for a plain exit (export/process_end.py)."""
    record = {
        "k": "end_marker",
        "t": time.time_ns(),
        "clean": clean,
        "spans_started": spans_started,
        "spans_ended": spans_ended,
    }
    if ended_by is not None:
        record["ended_by"] = ended_by
    return record


def header_record(seq: int, resource: Mapping[str, Any], versions: Mapping[str, str]) -> dict[str, Any]:
    return {
        "k": "header",
        "v": FORMAT_VERSION,
        "t": time.time_ns(),
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "host": socket.gethostname(),
        "seq": seq,
        "resource": dict(resource),
        "versions": dict(versions),
        "argv": redacted_argv(sys.argv),
        "sampling": "all spans, whatever the tracer provider's sampler exports",
    }


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
