"""`release/` holds the checks that run inside each release's own process (`test_releases.py`
starts them); the suite's own process, on 0.18, does not collect them."""

import os

collect_ignore = [] if os.environ.get("VLMTRACE_MATRIX_RELEASE") else ["release"]
