"""`relay`: how a wrapped output stream reports its end (the request span ends there)."""

from __future__ import annotations

import asyncio

import pytest

from vlmtrace.instrumentation.runtime import relay


class Outputs:
    """An engine's output stream: three outputs, or an error after the first."""

    def __init__(self, fail: bool = False):
        self.fail = fail
        self.closed = False

    async def stream(self):
        try:
            for index in range(3):
                if self.fail and index == 1:
                    raise RuntimeError("engine died")
                yield index
        finally:
            self.closed = True


def run(consume):
    seen, ends = [], []
    outputs = Outputs(fail=consume == "fail")
    stream = relay(outputs.stream(), seen.append, ends.append)

    async def main():
        if consume == "break":
            async for _ in stream:
                break
            await stream.aclose()  # what `async for` in LMDeploy's callers leaves to the caller
            return
        async for _ in stream:
            pass

    if consume == "fail":
        with pytest.raises(RuntimeError, match="engine died"):
            asyncio.run(main())
    else:
        asyncio.run(main())
    return seen, ends, outputs.closed


def test_a_stream_read_to_the_end_reports_no_error():
    seen, ends, closed = run("all")
    assert seen == [0, 1, 2] and ends == [None] and closed


def test_a_consumer_closing_early_ends_it_at_once():
    seen, ends, closed = run("break")
    assert seen == [0] and closed
    (error,) = ends
    assert isinstance(error, GeneratorExit)  # which SpanHandle.end does not count as an error


def test_an_engine_error_is_reported_and_still_reaches_the_consumer():
    seen, ends, closed = run("fail")
    assert seen == [0] and closed
    (error,) = ends
    assert isinstance(error, RuntimeError)
