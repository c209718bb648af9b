"""Sites are named from source lines: the function holding a line, read from the indentation above it, is
the function Python compiled there (its `__qualname__` without `<locals>`), across vlmtrace's own modules,
asyncio's and LMDeploy's vision engine."""

from __future__ import annotations

import asyncio.base_events
import contextlib
import importlib
import inspect
import types

import pytest

from vlmtrace.capture.sites import function_at
from vlmtrace.instrumentation import request, vision


def _functions(code: types.CodeType):
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield constant
            yield from _functions(constant)


def _body_lines(code: types.CodeType) -> set[int]:
    """Lines of this function's own body: its code's lines, less those of functions nested in it."""
    own = {line for _, _, line in code.co_lines() if line is not None and line > code.co_firstlineno}
    for nested in _functions(code):
        own -= {line for _, _, line in nested.co_lines() if line is not None}
        own.discard(nested.co_firstlineno)
    return own


def _modules():
    modules = [vision, request, asyncio.base_events]
    with contextlib.suppress(ImportError):
        modules.append(importlib.import_module("lmdeploy.vl.engine"))
    return modules


@pytest.mark.parametrize("module", _modules(), ids=lambda module: module.__name__)
def test_the_function_at_a_line_is_the_one_python_compiled_there(module):
    with open(module.__file__) as source:
        top = compile(source.read(), module.__file__, "exec")
    checked = 0
    for code in _functions(top):
        if code.co_name.startswith("<") or not code.co_flags & inspect.CO_OPTIMIZED:  # lambdas, class bodies
            continue
        expected = code.co_qualname.replace("<locals>.", "")
        for line in _body_lines(code):
            assert function_at(module.__file__, line) == expected, (line, expected)
            checked += 1
    assert checked > 20


def test_a_line_outside_any_function_or_of_no_file_has_no_function(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("import os\n\nclass A:\n    x = 1\n\n    def f(self):\n        return 2\n")
    assert function_at(str(source), 1) is None and function_at(str(source), 4) is None
    assert function_at(str(source), 7) == "A.f"
    assert function_at(str(tmp_path / "gone.py"), 3) is None and function_at("<string>", 1) is None
