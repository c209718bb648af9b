"""The compiled parts, built with the wheel (Linux): `vlmtrace._core`, the extension module every process
loads (the fatal-signal guard; docs/performance.md), and the heap counter, a plain shared library that
`vlmtrace run --heap-counter` preloads (it needs no Python). Everything else is in pyproject.toml."""

import sys

from setuptools import Extension, setup

LINUX = sys.platform.startswith("linux")
FLAGS = ["-O2", "-fvisibility=hidden"]

setup(
    ext_modules=[
        Extension(
            "vlmtrace._core", ["src/vlmtrace/_core.c", "src/vlmtrace/export/fatal_guard.c"], extra_compile_args=FLAGS
        ),
        # The preloaded library keeps its symbols visible: it stands in for malloc and free.
        Extension("vlmtrace.probes._heap_counter", ["src/vlmtrace/probes/heap_counter.c"], extra_compile_args=["-O2"]),
    ]
    if LINUX
    else []
)
