"""PID 1 of every sandbox: `python3 -I -S /opt/mcp-code-executor/runner.py [PYTHON]`.

The runner itself is the package `mcp_runner` beside this file (its `__init__` describes
the protocol). `-I` leaves this file's directory off `sys.path`, so it is put there here,
for the runner only: the user's interpreter is another process and never sees it."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from mcp_runner.main import main  # noqa: E402

main()
