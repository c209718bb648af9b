"""Writing what a command produces (the HTML report, its JSON summary) whole or not at all: to a
temporary file beside the target, then renamed over it. A report interrupted while it is written (a
full disk, Ctrl-C, a CI job's timeout) leaves the previous file, if any, and never half a page that a
browser would show as if it were complete."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def replace_file(path: str | Path, data: str | bytes) -> None:
    target = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    descriptor, partial = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".partial")
    try:
        with os.fdopen(descriptor, "wb") as stream:
            stream.write(payload)
        os.chmod(partial, 0o666 & ~_umask())
        os.replace(partial, target)
    except BaseException:
        if os.path.exists(partial):
            os.unlink(partial)
        raise


def _umask() -> int:
    """The process's umask (read by setting it: there is no other way), so the file gets the mode a
    plain open() would have given it, not mkstemp's 0600."""
    mask = os.umask(0)
    os.umask(mask)
    return mask
