"""Put first on PYTHONPATH by `vlmtrace run`: Python imports this at start in the program and in every
Python process it starts. It runs the sitecustomize it hides (a distribution's, a virtualenv's), then
arms vlmtrace (see vlmtrace/launch/bootstrap.py)."""

import importlib.machinery
import importlib.util
import os
import sys


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    others = [path for path in sys.path if os.path.abspath(path or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_chain()
try:
    from vlmtrace.launch.bootstrap import arm
except ImportError as error:
    sys.stderr.write(
        f"vlmtrace run: {sys.executable} cannot import vlmtrace ({error}); process {os.getpid()} is not traced\n"
    )
else:
    arm()
