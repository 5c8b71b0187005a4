"""Real lm-eval runs for the import tests, several in one Python process.

Each run is lm-eval's own console-script function (``lm_eval.__main__.cli_evaluate``) on its
own argument list, exactly what the ``lm_eval`` command runs; only the interpreter start and
the imports (about 11 s a run on 2 cores) are shared between the runs of one call.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

_DRIVER = """\
import json, sys
from lm_eval.__main__ import cli_evaluate
for argv in json.loads(sys.argv[1]):
    sys.argv = ["lm_eval", *argv]
    cli_evaluate()
"""


def run_lmeval(argvs: list[list[str]], env: dict, cwd: Path | None = None, timeout: int = 900):
    """Run ``lm_eval ARGV`` for every ARGV in ``argvs``, in order, in one subprocess with
    environment ``env``; returns the CompletedProcess (non-zero at the first failing run)."""
    return subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(argvs)], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=cwd)
