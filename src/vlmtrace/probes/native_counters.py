"""Torch's allocator counters through a compiled read: 1.8 µs a device where the nested statistics dict
takes 12.7 µs in an idle process on an H200 host, and ~60–100 µs inside the PyTorch engine's loop
(docs/performance.md). The PyTorch engine's span boundaries read them ~18 times a batch.

It needs the installed torch's headers, so it cannot ship in the wheel: `torch_counters.cpp` is compiled
once per torch installation by `vlmtrace doctor --build` or `vlmtrace run` (the system's C++ compiler, never
inside the instrumented process) into a cache keyed by torch's version, its place and the source
(`$VLMTRACE_CACHE_DIR`, else `$XDG_CACHE_HOME/vlmtrace`, else ~/.cache/vlmtrace). Where torch's c10 has
the device-generic allocator interface, its headers are all it needs; older torch reaches the counters
through c10::cuda, whose header needs CUDA's (the nvidia-* wheels' include directories, `nvidia-cuda-crt`'s
for CUDA 13, or CUDA_HOME's). An instrumented process loads a built library once CUDA is up, and uses it
only after its counters equal torch's own dict; until then, and wherever it is not built, readings take
the Python path. On by default (`native_counters=False`, VLMTRACE_NATIVE_COUNTERS=0 turn it off): on the
PyTorch engine it took a quarter off vlmtrace's own CPU per batch (docs/performance.md).
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import logging
import os
import shutil
import subprocess
import tempfile
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

_log = logging.getLogger(__name__)
SOURCE = Path(__file__).with_name("torch_counters.cpp")
COUNTERS = 5  # allocated, reserved, inactive_split, alloc_retries, ooms: TorchReading's order
BUILD_TIMEOUT_S = 120
AGREEMENT_TRIES = 5  # back-to-back reads of both that may differ while another thread allocates


def cache_dir() -> Path:
    explicit = os.environ.get("VLMTRACE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vlmtrace"


def include_dirs(torch_dir: Path) -> list[str]:
    """torch's headers, then every nvidia-* wheel's include directory (found the way Python finds the
    `nvidia` namespace package), then CUDA_HOME's."""
    found = [str(torch_dir / "include")]
    try:
        import nvidia

        found += sorted(
            {str(path) for root in nvidia.__path__ for path in Path(root).glob("*/include") if path.is_dir()}
        )
    except ImportError:
        pass
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home and (Path(cuda_home) / "include").is_dir():
        found.append(str(Path(cuda_home) / "include"))
    return found


REQUIRED_HEADERS = ("cuda_runtime_api.h", "crt/host_defines.h")  # c10::cuda's, where it is the way in
GENERIC_ALLOCATOR_HEADER = Path("include/c10/core/CachingDeviceAllocator.h")


def has_generic_allocator(torch_dir: Path) -> bool:
    """Whether torch's c10 declares getDeviceAllocator (the interface torch.accelerator reads)."""
    header = torch_dir / GENERIC_ALLOCATOR_HEADER
    return header.is_file() and "getDeviceAllocator" in header.read_text(errors="replace")


def compile_library(
    command: list[str],
    source: Path,
    library: Path,
    verify: Callable[[str], None] | None = None,
    timeout_s: float = BUILD_TIMEOUT_S,
) -> None:
    """Run the compiler `command` (everything but `-o FILE`) into a file beside `library`, let `verify` refuse
    that file (by raising), and move it to `library` whole or not at all: other processes may load it at
    once. RuntimeError with the compiler's last line where it fails; no partial file is left behind."""
    library.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=library.parent, suffix=".so", delete=False) as partial:
        pass
    try:
        result = subprocess.run(
            [*command, "-o", partial.name], capture_output=True, text=True, timeout=timeout_s, check=False
        )
        if result.returncode != 0:
            last = (result.stderr.strip().splitlines() or ["(no message)"])[-1]
            raise RuntimeError(f"compiling {source.name} failed: {last}")
        if verify is not None:
            verify(partial.name)
        os.replace(partial.name, library)
    finally:
        if os.path.exists(partial.name):
            os.unlink(partial.name)


def find_compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def library_path(torch_dir: Path) -> Path:
    """Where the library built for the torch installed at `torch_dir` is (found without importing torch)."""
    version = torch_dir / "version.py"
    key = hashlib.sha256(
        SOURCE.read_bytes() + (version.read_bytes() if version.is_file() else b"") + str(torch_dir).encode()
    ).hexdigest()[:16]
    return cache_dir() / f"torch_counters-{key}.so"


def installed_torch_dir() -> Path | None:
    spec = importlib.util.find_spec("torch")
    return Path(spec.submodule_search_locations[0]) if spec is not None and spec.submodule_search_locations else None


def build(compiler: str | None = None) -> Path:
    """The library for the installed torch, compiled first if it is not in the cache (torch is imported
    then: its C++ ABI). RuntimeError (or OSError, SubprocessError) where it cannot be built."""
    torch_dir = installed_torch_dir()
    if torch_dir is None:
        raise RuntimeError("torch is not installed")
    library = library_path(torch_dir)
    if library.exists():
        return library
    compiler = compiler or find_compiler()
    if compiler is None:
        raise RuntimeError("no C++ compiler (g++, c++ or $CXX)")
    import torch

    if has_generic_allocator(torch_dir):
        headers, libraries = ["-DVLMTRACE_DEVICE_ALLOCATOR", "-I", str(torch_dir / "include")], ["-lc10"]
    else:
        headers = [flag for include in include_dirs(torch_dir) for flag in ("-I", include)]
        libraries = ["-lc10", "-lc10_cuda"]
    compile_library(
        [
            compiler,
            "-O2",
            "-shared",
            "-fPIC",
            "-std=c++20",
            f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            *headers,
            str(SOURCE),
            "-L",
            str(torch_dir / "lib"),
            *libraries,
            f"-Wl,-rpath,{torch_dir / 'lib'}",
        ],
        SOURCE,
        library,
    )
    return library


def readiness(torch_dir: Path, enabled: bool = True) -> str:
    """What `vlmtrace doctor` says of the compiled read, without building it: whether it can be."""
    if not enabled:
        return "off (native_counters=False or VLMTRACE_NATIVE_COUNTERS=0): torch's counters are read through Python"
    if library_path(torch_dir).exists():
        return "compiled read: built for this torch, used once CUDA is up and checked against torch's own counters"
    compiler = find_compiler()
    if compiler is None:
        return "Python path: no C++ compiler (g++, c++ or $CXX)"
    if has_generic_allocator(torch_dir):
        return (
            f"Python path until built: `vlmtrace doctor --build` (or `vlmtrace run`) builds it with {compiler} "
            "against torch's c10"
        )
    includes = include_dirs(torch_dir)
    missing = [
        header for header in REQUIRED_HEADERS if not any((Path(include) / header).exists() for include in includes)
    ]
    if missing:
        return (
            f"Python path: {', '.join(missing)} not found (a CUDA toolkit with CUDA_HOME set, or "
            "`pip install nvidia-cuda-crt` matching torch's CUDA)"
        )
    return f"Python path until built: `vlmtrace doctor --build` (or `vlmtrace run`) builds it with {compiler}"


# One fork hook for all instances (a session per instrument() call): a hook per instance would keep
# every instance alive.
_INSTANCES: weakref.WeakSet = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for instance in list(_INSTANCES):
        instance._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


class NativeCounters:
    """The compiled read for one process: `read(ordinal)` gives the five counters, or None while the
    library is not (or cannot be) in use. `state` says which."""

    def __init__(self, torch: ModuleType, reference: Callable[[int], tuple[int, ...]]) -> None:
        """`reference(ordinal)`: the five counters as torch's own statistics give them, in the same order."""
        self._torch = torch
        self._reference = reference
        self._function: Callable | None = None
        self._started = False
        self._done = threading.Event()  # set when the library is in use or given up
        self._lock = threading.Lock()
        self.state = "not started"
        _INSTANCES.add(self)

    def _after_fork(self) -> None:
        if self._function is None:  # a load the parent had under way has no thread here
            self._started, self.state, self._done = False, "not started", threading.Event()

    def start(self) -> None:
        """Load and check the built library on a daemon thread (never a compiler); returns at once."""
        with self._lock:
            if self._started:
                return
            self._started = True
            self.state = "loading"
        threading.Thread(target=self._prepare, name="vlmtrace-native-counters", daemon=True).start()

    def wait(self, timeout_s: float | None = None) -> str:
        """Until the library is in use or given up (at most `timeout_s`), if started; the state then."""
        if self._started:
            self._done.wait(timeout_s)
        return self.state

    def _prepare(self) -> None:
        try:
            torch_file = self._torch.__file__
            if torch_file is None:
                raise RuntimeError("torch has no installed files to build against")
            library = library_path(Path(torch_file).parent)
            if not library.exists():
                raise RuntimeError("not built for this torch (`vlmtrace doctor --build` or `vlmtrace run` builds it)")
            function = ctypes.CDLL(str(library)).vlmtrace_torch_counters
            function.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int64)]
            function.restype = ctypes.c_int
            self._check(function)
        except (OSError, RuntimeError, AttributeError) as error:
            self.state = f"unavailable: {error}"
            _log.info("vlmtrace: torch's counters are read through Python: %s", error)
        else:
            self._function = function
            self.state = "ready"
        finally:
            self._done.set()

    def _check(self, function: Callable) -> None:
        """The library's counters must equal torch's own for device 0 in one of a few back-to-back pairs."""
        out = (ctypes.c_int64 * COUNTERS)()
        for _ in range(AGREEMENT_TRIES):
            if function(0, out) != 0:
                raise RuntimeError("the compiled read failed (no CUDA device?)")
            if tuple(out) == tuple(self._reference(0)):
                return
        raise RuntimeError("the compiled read disagrees with torch.cuda.memory_stats()")

    def read(self, ordinal: int) -> tuple[int, ...] | None:
        function = self._function
        if function is None:
            return None
        out = (ctypes.c_int64 * COUNTERS)()  # one per call: the sampler's thread reads too
        return tuple(out) if function(ordinal, out) == 0 else None
