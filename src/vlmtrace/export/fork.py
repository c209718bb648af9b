"""Fork handling shared by the export objects: a forked child must not inherit a parent's files or counts."""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable


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
