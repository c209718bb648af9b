"""Fork handling shared by the export objects: a forked child must not inherit a parent's files or counts,
and a child that multiprocessing started ends its own journal."""

from __future__ import annotations

import os
import sys
import weakref
from collections.abc import Callable
from typing import Protocol

# multiprocessing's own exit function runs its finalizers by priority, highest first: ours comes last,
# after the target has returned and the child's own finalizers (and joins) are done.
LAST = -(1 << 30)


class Closes(Protocol):
    def close(self) -> None: ...


def after_fork_in_child(method: Callable[[], None]) -> None:
    """Call the bound `method` in every forked child while its object is alive, without keeping it alive."""
    if not hasattr(os, "register_at_fork"):
        return
    weak_method = weakref.WeakMethod(method)

    def call_if_alive() -> None:
        alive = weak_method()
        if alive is not None:
            alive()

    os.register_at_fork(after_in_child=call_if_alive)


def close_in_multiprocessing_children(owner: Closes) -> None:
    """Call `owner.close()` at the end of every child that multiprocessing forks while `owner` is alive.

    Such a child ends with `os._exit` once its target returns: atexit never runs there. multiprocessing
    runs its finalizers first, but forgets those of the parent at the child's start; so the finalizer is
    registered in the child, by an after-fork callback that the parent registers just before its first fork.
    """
    if not hasattr(os, "register_at_fork"):
        return
    weak_owner = weakref.ref(owner)
    registered: list[bool] = []

    def before_fork() -> None:
        util = sys.modules.get("multiprocessing.util")
        alive = weak_owner()
        if util is not None and alive is not None and not registered:
            registered.append(True)
            util.register_after_fork(alive, _finalize_in_child)

    os.register_at_fork(before=before_fork)


def _finalize_in_child(owner: Closes) -> None:
    from multiprocessing import util

    util.Finalize(owner, owner.close, exitpriority=LAST)
