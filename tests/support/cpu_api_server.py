"""`lmdeploy serve api_server ...` on a CPU: LMDeploy's real CLI, FastAPI server and engines' Python code.

    python -m tests.support.cpu_api_server serve api_server MODEL --backend turbomind|pytorch [...]

takes the same arguments as the `lmdeploy` command. TurboMind's native engine gets the stand-in of
tests/support/cpu_lmdeploy.py (in this process); the PyTorch engine runs in its own spawned process as
with `enable_mp_engine`, over LMDeploy's real RPC, around the stand-in Engine of
tests/support/pytorch_engine_standin.py.
"""

import sys

if __name__ == "__main__":
    from tests.support.cpu_lmdeploy import cpu_lmdeploy

    with cpu_lmdeploy():
        from lmdeploy.cli import run

        from tests.support.pytorch_engine_standin import use_standin_engine_process

        use_standin_engine_process()
        sys.exit(run())
