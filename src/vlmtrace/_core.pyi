"""The compiled core (_core.c): what type checkers see of it. Every call holds the GIL."""

def image_sizes(messages: object, /) -> tuple[int, list[tuple[int, int]]]:
    """(images, sizes) of OpenAI-style messages: the images' count and the (width, height) of those with one."""

def statm_rss(fd: int, page_size: int, /) -> int:
    """Resident bytes from /proc/self/statm open at `fd`; OSError where it cannot be read or parsed."""

def guard_front(signum: int, /) -> None:
    """Put the guard in front of what is installed now for a signal; OSError where it cannot."""

def guard_behind_installed(signum: int, /) -> None:
    """Pass a signal on to what is installed now for it."""

def guard_terminating(signum: int, bound_ms: int, /) -> None:
    """Bound a terminating signal's end."""

def guard_dying() -> bool:
    """Whether a fatal signal's chain is running."""

def guard_set_bound_ms(milliseconds: int, /) -> None:
    """The longest time a fatal signal's chain may take."""

def guard_address() -> int:
    """The guard's handler address, as sigaction gives it."""
