"""The package installed from its wheel into a fresh venv works away from the checkout
(.ci/wheel_check.sh, also a step of .ci/run): schemas, default envelope and task files come
from the wheel; certify, import lm-eval, grid on config/paper.yaml by absolute path, and a
usage error (exit 2, one line), all run from a folder outside the checkout."""

import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow


def test_wheel_installs_and_runs_outside_the_checkout(tmp_path):
    p = subprocess.run([str(ROOT / ".ci" / "wheel_check.sh"), sys.executable, str(tmp_path)],
                       capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out = p.stdout
    assert "wheel-check: package, schemas, tasks and envelope" in out
    assert "wheel-check: grid 612 cells" in out and "wheel-check: import lm-eval + certify: item level" in out
    assert out.rstrip().endswith("wheel-check: ok")
    wheel = next((tmp_path / "dist").glob("safetyrepro-*.whl"))
    import zipfile

    names = set(zipfile.ZipFile(wheel).namelist())
    for f in ("safetyrepro/data/envelope.yaml", "safetyrepro/data/schema/config.schema.json",
              "safetyrepro/data/schema/envelope.schema.json", "safetyrepro/data/schema/task.schema.json",
              "safetyrepro/tasks/bbq.yaml"):
        assert f in names, f"{f} not in {wheel.name}"
