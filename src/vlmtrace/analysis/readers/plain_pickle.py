"""A pickle of plain data (a PyTorch memory snapshot) decoded without `pickle`'s general machinery.

`pickle.Unpickler` with every class refused still lets a few bytes cost the machine: a memo index of
2**32 allocates the memo array up to it, millions of empty-set opcodes build millions of sets, a
million nested tuples used as a dict key overflow the C stack when hashed, and its C loop cannot be
interrupted for the CPU budget. This decoder reads the opcodes itself (the binary protocols, 2-5: PyTorch
writes 4 or 5) and builds only dicts, lists, tuples, sets, text, bytes and numbers; each object it builds is charged against
`max_bytes` at about what CPython spends on it, the memo is a dict bounded by that same charge, dict
keys and set members must be text, bytes or numbers (hashing them never recurses), marks nest at most
MAX_MARKS deep, and the budget's CPU time is looked at every CHECK_OPCODES opcodes. Anything else
raises `PickleRefused` with what it met.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import IO, Any

READ_BYTES = 1 << 20
CHECK_OPCODES = 4096
MAX_MARKS = 1000  # marks open at once: a snapshot's nesting is a few levels
LONG_DIGITS = 4300  # an integer's text or bytes (Python's own int/str conversion limit)
# What CPython spends per object built, about (64-bit): the charge against `max_bytes`.
OBJECT_BYTES = 64
ITEM_BYTES = 16
# A dict key or set member: text or bytes (their hashes are randomised), or an integer small enough that
# distinct ones never share a hash (integers and floats hash to their value: 60,000 keys chosen to collide
# take a dict minutes to build).
SMALL_INT = 1 << 20


class PickleRefused(ValueError):
    """The pickle holds something this decoder does not build, or costs more than it may."""


class _Mark:
    """MARK on the stack."""


MARK = _Mark()


class _Input:
    """The stream in READ_BYTES pieces."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream, self._buffer, self._at = stream, b"", 0

    def take(self, count: int) -> bytes:
        end = self._at + count
        if end <= len(self._buffer):
            piece = self._buffer[self._at : end]
            self._at = end
            return piece
        pieces, needed = [self._buffer[self._at :]], count - (len(self._buffer) - self._at)
        while needed > 0:
            more = self._stream.read(max(needed, READ_BYTES))
            if not more:
                raise EOFError("the pickle ends in the middle of an opcode")
            pieces.append(more[:needed])
            self._buffer, self._at = more, min(needed, len(more))
            needed -= len(more[:needed])
        return b"".join(pieces)

    def line(self, limit: int) -> bytes:
        """Up to and without the next newline (protocol 0's text arguments), at most `limit` bytes."""
        found, kept = [], 0
        while True:
            end = self._buffer.find(b"\n", self._at)
            if end >= 0:
                found.append(self._buffer[self._at : end])
                self._at = end + 1
                return b"".join(found)
            found.append(self._buffer[self._at :])
            kept += len(found[-1])
            if kept > limit:
                raise PickleRefused(f"a text argument longer than {limit:,} bytes")
            self._buffer, self._at = self._stream.read(READ_BYTES), 0
            if not self._buffer:
                raise EOFError("the pickle ends in the middle of a line")


def load(stream: IO[bytes], max_bytes: int, check: Callable[[], None]) -> Any:
    """The object the pickle in `stream` describes; `check()` is called every CHECK_OPCODES opcodes (it
    raises to stop). Raises PickleRefused, EOFError or ValueError for what it does not read."""
    return _Decoder(_Input(stream), max_bytes, check).run()


class _Decoder:
    def __init__(self, source: _Input, max_bytes: int, check: Callable[[], None]) -> None:
        self.source = source
        self.left = max_bytes
        self.max_bytes = max_bytes
        self.check = check
        self.stack: list[Any] = []
        self.marks: list[int] = []
        self.memo: dict[int, Any] = {}

    def charge(self, count: int) -> None:
        self.left -= count
        if self.left < 0:
            raise PickleRefused(f"it needs more than {self.max_bytes:,} bytes of memory once loaded")

    def push(self, value: Any, size: int = OBJECT_BYTES) -> None:
        self.charge(size)
        self.stack.append(value)

    def pop_mark(self) -> list[Any]:
        if not self.marks:
            raise PickleRefused("an opcode that needs a mark, without one")
        at = self.marks.pop()
        items = self.stack[at:]
        del self.stack[at:]
        return items

    def top(self) -> Any:
        if not self.stack:
            raise PickleRefused("an opcode that needs an object, on an empty stack")
        return self.stack[-1]

    def pop(self) -> Any:
        if not self.stack or (self.marks and len(self.stack) <= self.marks[-1]):
            raise PickleRefused("an opcode that needs an object, on an empty stack")
        return self.stack.pop()

    def text(self, count: int, decode: bool = True) -> Any:
        self.charge(OBJECT_BYTES + count)
        raw = self.source.take(count)
        return raw.decode("utf-8", "surrogatepass") if decode else raw

    def memoize(self, index: int) -> None:
        if index not in self.memo:
            self.charge(OBJECT_BYTES)
        self.memo[index] = self.top()

    def recall(self, index: int) -> None:
        try:
            self.push(self.memo[index], ITEM_BYTES)
        except KeyError:
            raise PickleRefused(f"memo entry {index} was never stored") from None

    def run(self) -> Any:
        source, stack, take = self.source, self.stack, self.source.take
        countdown = CHECK_OPCODES
        while True:
            countdown -= 1
            if countdown <= 0:
                countdown = CHECK_OPCODES
                self.check()
            countdown -= _common_opcodes(self)
            opcode = take(1)
            handler = _HANDLERS.get(opcode)
            if handler is not None:
                handler(self)
                continue
            if opcode == b".":  # STOP
                if len(stack) != 1 or self.marks:
                    raise PickleRefused("the pickle stops with a malformed stack")
                return stack[0]
            if opcode == b"\x80":  # PROTO
                take(1)
            elif opcode == b"\x95":  # FRAME: the frame's length says nothing the opcodes do not
                take(8)
            elif opcode in (
                b"c",
                b"\x93",
                b"i",
                b"R",
                b"b",
                b"o",
                b"\x81",
                b"\x92",
                b"P",
                b"Q",
                b"\x82",
                b"\x83",
                b"\x84",
                b"\x97",
                b"\x98",
            ):
                raise PickleRefused(_refusal(self, opcode, source))
            else:
                raise PickleRefused(f"opcode {opcode!r} is not one of a plain-data pickle")


def _common_opcodes(decoder: _Decoder) -> int:
    """The opcodes most of a snapshot is made of, read straight from the buffer while it holds them whole
    and the charge allows (BINGET, MEMOIZE, SHORT_BINUNICODE, MARK, EMPTY_DICT, BININT1, SETITEMS); returns
    how many.
    The others, and these near a buffer's end, go through the handlers."""
    source, stack, memo, marks = decoder.source, decoder.stack, decoder.memo, decoder.marks
    push, buffer, at, left = stack.append, source._buffer, source._at, decoder.left
    end, count, mark_room = len(buffer) - 300, 0, MAX_MARKS - len(marks)
    while at < end and left >= 0 and count < CHECK_OPCODES:
        opcode = buffer[at]
        if opcode == 0x68 and buffer[at + 1] in memo:  # BINGET
            push(memo[buffer[at + 1]])
            at, left = at + 2, left - ITEM_BYTES
        elif opcode == 0x94 and stack:  # MEMOIZE
            memo[len(memo)] = stack[-1]
            at, left = at + 1, left - OBJECT_BYTES
        elif opcode == 0x8C:  # SHORT_BINUNICODE
            size = buffer[at + 1]
            push(buffer[at + 2 : at + 2 + size].decode("utf-8", "surrogatepass"))
            at, left = at + 2 + size, left - OBJECT_BYTES - size
        elif opcode == 0x28 and mark_room > 0:  # MARK
            marks.append(len(stack))
            at, left, mark_room = at + 1, left - ITEM_BYTES, mark_room - 1
        elif opcode == 0x7D:  # EMPTY_DICT
            push({})
            at, left = at + 1, left - OBJECT_BYTES
        elif opcode == 0x4B:  # BININT1
            push(buffer[at + 1])
            at, left = at + 2, left - ITEM_BYTES
        elif opcode == 0x75 and marks and marks[-1] > 0 and type(stack[marks[-1] - 1]) is dict:  # SETITEMS
            items = stack[marks[-1] :]
            if len(items) % 2 or not all(type(key) is str for key in items[::2]):
                break  # the handler names what is wrong
            del stack[marks.pop() :]
            stack[-1].update(zip(items[::2], items[1::2], strict=True))
            at, left, mark_room = at + 1, left - len(items) * ITEM_BYTES, mark_room + 1
        else:
            break
        count += 1
    source._at, decoder.left = at, left
    decoder.charge(0)
    return count


def _refusal(decoder: _Decoder, opcode: bytes, source: _Input) -> str:
    """What a pickle asks for that builds code's objects (a class, a call, an extension)."""
    if opcode in (b"c", b"i"):  # GLOBAL, INST: "module\nname\n"
        module, name = (source.line(LONG_DIGITS)[:200].decode("utf-8", "replace") for _ in range(2))
        return f"refusing to load {module}.{name}: snapshots hold plain data only"
    if opcode == b"\x93" and len(decoder.stack) >= 2 and all(isinstance(item, str) for item in decoder.stack[-2:]):
        return f"refusing to load {decoder.stack[-2][:200]}.{decoder.stack[-1][:200]}: snapshots hold plain data only"
    return f"refusing opcode {opcode!r}: snapshots hold plain data only"


def _key(value: Any, what: str) -> Any:
    kind = type(value)
    if kind is str or kind is bytes or value is None or (kind in (int, bool) and -SMALL_INT < value < SMALL_INT):
        return value
    shown = "an integer past ±2**20" if kind is int else f"a {kind.__name__}"
    raise PickleRefused(f"{shown} as {what}: only text, bytes or small integers are read there")


def _set_items(decoder: _Decoder, target: dict, items: list) -> None:
    if len(items) % 2:
        raise PickleRefused("SETITEMS with an odd number of objects")
    if type(target) is not dict:
        raise PickleRefused("items set on something that is not a dict")
    decoder.charge(len(items) * ITEM_BYTES)
    for index in range(0, len(items), 2):
        target[_key(items[index], "a dict key")] = items[index + 1]


def _append(decoder: _Decoder, target: Any, items: list) -> None:
    if type(target) is not list:
        raise PickleRefused("items appended to something that is not a list")
    decoder.charge(len(items) * ITEM_BYTES)
    target.extend(items)


def _add_items(decoder: _Decoder) -> None:
    items = decoder.pop_mark()
    target = decoder.top()
    if type(target) is not set:
        raise PickleRefused("items added to something that is not a set")
    decoder.charge(len(items) * ITEM_BYTES)
    target.update(_key(item, "a set member") for item in items)


def _mark(decoder: _Decoder) -> None:
    if len(decoder.marks) >= MAX_MARKS:
        raise PickleRefused(f"marks nested deeper than {MAX_MARKS}")
    decoder.charge(ITEM_BYTES)
    decoder.marks.append(len(decoder.stack))


def _long(data: bytes) -> int:
    if len(data) > LONG_DIGITS:
        raise PickleRefused(f"an integer of {len(data):,} bytes")
    return int.from_bytes(data, "little", signed=True)


def _size(decoder: _Decoder, count: int) -> int:
    return int.from_bytes(decoder.source.take(count), "little")


def _frozenset(decoder: _Decoder) -> None:
    items = decoder.pop_mark()
    decoder.push(frozenset(_key(item, "a set member") for item in items), OBJECT_BYTES + len(items) * ITEM_BYTES)


def _tuple_from_mark(decoder: _Decoder) -> None:
    items = decoder.pop_mark()
    decoder.push(tuple(items), OBJECT_BYTES + len(items) * ITEM_BYTES)


def _long4(decoder: _Decoder) -> None:
    size = _size(decoder, 4)
    if size > LONG_DIGITS:
        raise PickleRefused(f"an integer of {size:,} bytes")
    decoder.push(_long(decoder.source.take(size)), OBJECT_BYTES)


def _tuple(decoder: _Decoder, count: int) -> None:
    if len(decoder.stack) - (decoder.marks[-1] if decoder.marks else 0) < count:
        raise PickleRefused("a tuple of more objects than the stack holds")
    items = tuple(decoder.stack[len(decoder.stack) - count :]) if count else ()
    del decoder.stack[len(decoder.stack) - count :]
    decoder.push(items, OBJECT_BYTES + count * ITEM_BYTES)


def _dict_from_mark(decoder: _Decoder) -> None:
    items = decoder.pop_mark()
    target: dict[Any, Any] = {}
    _set_items(decoder, target, items)
    decoder.push(target)


def _set_item(decoder: _Decoder) -> None:
    value, key = decoder.pop(), decoder.pop()
    _set_items(decoder, decoder.top(), [key, value])


def _set_items_from_mark(decoder: _Decoder) -> None:
    items = decoder.pop_mark()
    _set_items(decoder, decoder.top(), items)


def _append_one(decoder: _Decoder) -> None:
    value = decoder.pop()
    _append(decoder, decoder.top(), [value])


def _append_from_mark(decoder: _Decoder) -> None:
    items = decoder.pop_mark()
    _append(decoder, decoder.top(), items)


def _pop_mark(decoder: _Decoder) -> None:
    decoder.pop_mark()


def _dup(decoder: _Decoder) -> None:
    decoder.push(decoder.top(), ITEM_BYTES)


_HANDLERS: dict[bytes, Callable[[_Decoder], None]] = {
    b"}": lambda d: d.push({}),  # EMPTY_DICT
    b"]": lambda d: d.push([]),  # EMPTY_LIST
    b")": lambda d: d.push((), ITEM_BYTES),  # EMPTY_TUPLE
    b"\x8f": lambda d: d.push(set(), 4 * OBJECT_BYTES),  # EMPTY_SET
    b"\x90": _add_items,  # ADDITEMS
    b"\x91": _frozenset,  # FROZENSET
    b"(": _mark,  # MARK
    b"0": lambda d: d.pop(),  # POP
    b"1": _pop_mark,  # POP_MARK
    b"2": _dup,  # DUP
    b"t": _tuple_from_mark,  # TUPLE
    b"\x85": lambda d: _tuple(d, 1),  # TUPLE1
    b"\x86": lambda d: _tuple(d, 2),  # TUPLE2
    b"\x87": lambda d: _tuple(d, 3),  # TUPLE3
    b"l": lambda d: d.push(d.pop_mark()),  # LIST
    b"d": _dict_from_mark,  # DICT
    b"a": _append_one,  # APPEND
    b"e": _append_from_mark,  # APPENDS
    b"s": _set_item,  # SETITEM
    b"u": _set_items_from_mark,  # SETITEMS
    b"N": lambda d: d.push(None, ITEM_BYTES),  # NONE
    b"\x88": lambda d: d.push(True, ITEM_BYTES),  # NEWTRUE
    b"\x89": lambda d: d.push(False, ITEM_BYTES),  # NEWFALSE
    b"J": lambda d: d.push(struct.unpack("<i", d.source.take(4))[0], OBJECT_BYTES),  # BININT
    b"K": lambda d: d.push(d.source.take(1)[0], ITEM_BYTES),  # BININT1
    b"M": lambda d: d.push(_size(d, 2), ITEM_BYTES),  # BININT2
    b"\x8a": lambda d: d.push(_long(d.source.take(_size(d, 1))), OBJECT_BYTES),  # LONG1
    b"\x8b": _long4,  # LONG4
    b"G": lambda d: d.push(struct.unpack(">d", d.source.take(8))[0], OBJECT_BYTES),  # BINFLOAT
    b"\x8c": lambda d: d.push(d.text(_size(d, 1)), 0),  # SHORT_BINUNICODE
    b"X": lambda d: d.push(d.text(_size(d, 4)), 0),  # BINUNICODE
    b"\x8d": lambda d: d.push(d.text(_size(d, 8)), 0),  # BINUNICODE8
    b"U": lambda d: d.push(d.text(_size(d, 1), False).decode("latin-1"), 0),  # SHORT_BINSTRING
    b"T": lambda d: d.push(d.text(_size(d, 4), False).decode("latin-1"), 0),  # BINSTRING
    b"C": lambda d: d.push(d.text(_size(d, 1), False), 0),  # SHORT_BINBYTES
    b"B": lambda d: d.push(d.text(_size(d, 4), False), 0),  # BINBYTES
    b"\x8e": lambda d: d.push(d.text(_size(d, 8), False), 0),  # BINBYTES8
    b"\x96": lambda d: d.push(bytearray(d.text(_size(d, 8), False)), 0),  # BYTEARRAY8
    b"q": lambda d: d.memoize(_size(d, 1)),  # BINPUT
    b"r": lambda d: d.memoize(_size(d, 4)),  # LONG_BINPUT
    b"\x94": lambda d: d.memoize(len(d.memo)),  # MEMOIZE
    b"h": lambda d: d.recall(_size(d, 1)),  # BINGET
    b"j": lambda d: d.recall(_size(d, 4)),  # LONG_BINGET
}
