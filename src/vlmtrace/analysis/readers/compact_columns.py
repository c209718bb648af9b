"""Journal format 3 read in columns (journal_columns.py, docs/journal.md Format 3): DuckDB turns each
reading array into the columns format 2's reading objects gave, reads each attribute the header declares
under its index, and a compact end record takes what it left out from its start record in the same file. The result is the line reader's (compact_records.py); where
a file holds what only the line reader reads as it should (a compact end whose start is not in the file,
a read time that is not an integer, an attribute key that is no declared index), `completed` or
`odd_keys` says so and the file goes to the line reader.
"""

from __future__ import annotations

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from vlmtrace import semconv as sc
from vlmtrace.analysis.readers.compact_records import LINKED_STARTS
from vlmtrace.analysis.step1_loading.column_keys import SAMPLE_JSON_KEYS, SAMPLE_NUMERIC_KEYS

_INTEGER = r"^-?[0-9]+$"


def indexed(names: tuple[str, ...], fields: dict[str, str]) -> dict[str, str]:
    """The attribute struct's fields as a file that declares `names` writes them: each declared name under
    its index."""
    index = {name: str(slot) for slot, name in enumerate(names)}
    return {index.get(name, name): kind for name, kind in fields.items()}


def renamed(attrs: pa.StructArray, fields: dict[str, str]) -> pa.StructArray:
    """The attribute struct read by index, with its fields named as `fields` names them."""
    return pa.StructArray.from_arrays(
        [attrs.field(i) for i in range(attrs.type.num_fields)], names=list(fields), mask=attrs.is_null()
    )


def odd_keys(names: tuple[str, ...]) -> str:
    """SQL that counts the start and end records with an attribute key the line reader reads otherwise than
    the struct of `indexed` fields: an index the header does not declare (the line reader drops and counts
    it), a name behind a `=`, or a declared name written in full."""
    declared = ", ".join("'" + name.replace("'", "''") + "'" for name in names)
    odd = (
        "(regexp_full_match(key, '[0-9]+') AND NOT coalesce(regexp_full_match(key, '0|[1-9][0-9]{0,5}') "
        f"AND TRY_CAST(key AS INTEGER) < {len(names)}, false)) OR starts_with(key, '=')"
    )
    if declared:
        odd += f" OR list_contains([{declared}], key)"
    return (
        "SELECT count(*) FROM read_json(?, format = 'newline_delimited', records = true, "
        "columns = {'k': 'VARCHAR', 'attrs': 'JSON'}, maximum_object_size = ?) "
        f"WHERE k IN ('start', 'end') AND list_bool_or(list_transform(json_keys(attrs), lambda key: {odd}))"
    )


def _element(keys: tuple[str, ...], array: str, key: str, kind: str) -> str:
    """SQL for one key of a reading array as `kind` (NULL where the header declares no such key)."""
    if key not in keys:
        return f"NULL::{kind}"
    item = f"{array}[{keys.index(key) + 1}]"
    if key == sc.MEM_READ_TIME:
        return f"CAST(t + CAST({item} AS BIGINT) AS {kind})"  # an offset from the record's time
    return item if kind == "VARCHAR" else f"CAST({item} AS {kind})"


def _struct(keys: tuple[str, ...], array: str, fields: dict[str, str]) -> str:
    packed = ", ".join(f'"{name}" := {_element(keys, array, name, kind)}' for name, kind in fields.items())
    return f"CASE WHEN {array} IS NULL THEN NULL ELSE struct_pack({packed}) END"


def select(keys: tuple[str, ...], mem_types: dict[str, str]) -> str:
    """The SQL select list of a format 3 file: the records' own fields, then `mem` and `mem0` as the structs
    format 2's objects gave (`mem_types`, with the devices as JSON text), `sample` (a sample's reading as its
    attributes were), and the read-time offsets as written, to check that they are integers."""
    mem = {**mem_types, sc.MEM_DEVICES: "VARCHAR"}
    sample = {
        **dict.fromkeys(SAMPLE_NUMERIC_KEYS, "DOUBLE"),
        sc.MEM_DEVICES: "VARCHAR",
        **dict.fromkeys(SAMPLE_JSON_KEYS, "VARCHAR"),
    }
    selected = [
        "k, t, start, trace_id, span_id, parent_id, name, status, thread, attrs",
        f"{_struct(keys, 'mem', mem)} AS mem",
        f"{_struct(keys, 'mem0', mem_types)} AS mem0",
        f"{_struct(keys, 'mem', sample)} AS sample",
    ]
    if sc.MEM_READ_TIME in keys:
        index = keys.index(sc.MEM_READ_TIME) + 1
        selected.append(f"mem[{index}] AS read_offset, mem0[{index}] AS read_offset0")
    return ", ".join(selected)


def completed(
    column: dict[str, pa.Array], ends: np.ndarray, starts: np.ndarray, matched: np.ndarray, start_of_end: np.ndarray
) -> bool:
    """Complete the compact end records in `column` (in place) from their start records: ids, name, start
    time, the start's attributes under the end's, the start's reading for an absent `mem` or `mem0`, and
    the default status. False where a compact end has no start in the file, or a read time is no integer."""
    for name in ("read_offset", "read_offset0"):
        if name in column and pc.all(pc.match_substring_regex(column[name], _INTEGER)).as_py() is False:
            return False
    rows = len(column["k"])
    compact_ends = column["trace_id"].take(ends).is_null().to_numpy(zero_copy_only=False)
    if (compact_ends & ~matched).any():
        return False
    source = np.arange(rows)
    source[ends[compact_ends]] = starts[start_of_end[compact_ends]]
    compact = np.zeros(rows, bool)
    compact[ends[compact_ends]] = True
    taken = pa.array(source)
    mask = pa.array(compact)
    for name in ("trace_id", "parent_id", "name"):
        column[name] = pc.if_else(mask, column[name].take(taken), column[name])
    column["start"] = pc.if_else(mask, column["t"].take(taken), column["start"])
    is_end = np.zeros(rows, bool)
    is_end[ends] = True
    column["status"] = pc.if_else(pa.array(is_end), pc.coalesce(column["status"], pa.scalar("UNSET")), column["status"])
    attrs = column["attrs"]
    from_start = attrs.take(taken)
    column["attrs"] = pa.StructArray.from_arrays(
        [
            pc.if_else(pc.and_(mask, attrs.field(i).is_null()), from_start.field(i), attrs.field(i))
            for i in range(attrs.type.num_fields)
        ],
        fields=list(attrs.type),
    )
    start_mem = column["mem"].take(taken)
    column["mem"] = pc.if_else(pc.and_(mask, column["mem"].is_null()), start_mem, column["mem"])
    mem0 = column["mem0"]
    start_mem0 = pa.StructArray.from_arrays(
        [start_mem.field(field.name) for field in mem0.type], fields=list(mem0.type), mask=start_mem.is_null()
    )
    column["mem0"] = pc.if_else(pc.and_(mask, mem0.is_null()), start_mem0, mem0)
    return True


def linked_lines(
    lines: dict[int, bytes], waiting: np.ndarray, starts: np.ndarray, column: dict[str, pa.Array]
) -> dict[int, bytes]:
    """The lines of the starts still waiting for their end (`waiting`: their place among the file's
    `starts`) whose links name a span by its id alone, with those links whole where the line reader finds
    the linked start (one of the LINKED_STARTS before it in the file: compact_records.LinkedStarts)."""
    changed: dict[int, bytes] = {}
    places: dict[str, int] | None = None
    for place in waiting.tolist():
        row = int(starts[place])
        record = orjson.loads(lines[row])
        links = record.get("links") if type(record) is dict else None
        if type(links) is not list or not any(type(link) is str for link in links):
            continue
        if places is None:
            span_ids = column["span_id"].take(starts).to_pylist()
            places = {span_id: at for at, span_id in enumerate(span_ids) if type(span_id) is str}
            trace_ids = column["trace_id"].take(starts).to_pylist()
        found = {
            link: trace_ids[at]
            for link in links
            if type(link) is str
            and (at := places.get(link)) is not None
            and place - LINKED_STARTS <= at < place
            and type(trace_ids[at]) is str
        }
        whole = [
            {"trace_id": found[link], "span_id": link} if type(link) is str and link in found else link
            for link in links
        ]
        changed[row] = orjson.dumps({**record, "links": whole})
    return changed
