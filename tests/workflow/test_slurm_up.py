"""The CI cluster's start script recovers from a slurmd that never registers, and says why
when it cannot.

In CI on 2026-12-03 the node stayed 'unk*' for the whole 60 s wait (the controller never heard
from slurmd), and the tail of the log showed nothing of the cause. up.sh now starts slurmd
only once the controller answers, restarts a slurmd that has not registered in time, and ends
a failure with the daemons' error lines and the reason. These tests replace slurmd by a
stand-in that never registers (a copy of `sleep` named slurmd, so the pid checks see a live
slurmd), first once, then always. They stop the cluster the other Slurm tests use and start it
again at the end, so they run in the Slurm step only (marker and variable as test_slurm.py).
"""

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from slurm_helpers import REPO_ROOT, SLURM_CLUSTER_ONLY

pytestmark = SLURM_CLUSTER_ONLY

UP = REPO_ROOT / ".ci" / "slurm" / "up.sh"
DOWN = REPO_ROOT / ".ci" / "slurm" / "down.sh"
REAL_SLURMD = shutil.which("slurmd")


def _fake_slurmd(bin_dir: Path, state: Path, silent_starts: int) -> None:
    """A `slurmd` on PATH whose first `silent_starts` daemon starts run a silent stand-in
    (writing its pid where up.sh looks for it); later starts and `slurmd -C` run the real one."""
    stand_in = bin_dir / "stand-in" / "slurmd"
    stand_in.parent.mkdir(parents=True)
    shutil.copy(shutil.which("sleep"), stand_in)
    counter = bin_dir / "starts"
    script = bin_dir / "slurmd"
    script.write_text(
        "#!/bin/bash\n"
        f'[ "$1" = -C ] && exec {REAL_SLURMD} "$@"\n'
        f"n=$(( $(cat {counter} 2>/dev/null || echo 0) + 1 )); echo $n > {counter}\n"
        f"if [ $n -le {silent_starts} ]; then\n"
        f"  nohup {stand_in} 600 >/dev/null 2>&1 &\n"
        f"  echo $! > {state}/slurmd.pid\n"
        "  exit 0\n"
        "fi\n"
        f'exec {REAL_SLURMD} "$@"\n'
    )
    script.chmod(0o755)


def _stand_ins_alive(bin_dir: Path) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True)
    return [line for line in ps.stdout.splitlines() if str(bin_dir / "stand-in") in line]


def _up(env_extra: dict, timeout: int = 200) -> subprocess.CompletedProcess:
    env = {**os.environ, **env_extra}
    return subprocess.run(
        ["bash", str(UP)], capture_output=True, text=True, env=env, timeout=timeout
    )


def _up_with_stand_in(
    state: Path, bin_dir: Path, silent_starts: int, register_s: int, wait_s: int
) -> subprocess.CompletedProcess:
    """up.sh with its own state dir, the stand-in slurmd first on PATH, and short limits."""
    _fake_slurmd(bin_dir, state, silent_starts)
    return _up(
        {
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "SAFETYREPRO_SLURM_STATE": str(state),
            "SAFETYREPRO_SLURM_REGISTER": str(register_s),
            "SAFETYREPRO_SLURM_WAIT": str(wait_s),
        }
    )


@pytest.fixture
def own_cluster(tmp_path):
    """Stop the shared cluster; afterwards stop ours and bring the shared one back up."""
    subprocess.run(["bash", str(DOWN)], check=True, capture_output=True, timeout=200)
    # munged (run as the munge user) must reach the state dir: pytest's tmp_path sits under
    # directories only root may enter, so the state dir goes directly under /tmp.
    state = Path(tempfile.mkdtemp(prefix="safetyrepro-slurm-test-", dir="/tmp"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    yield state, bin_dir
    env = {**os.environ, "SAFETYREPRO_SLURM_STATE": str(state)}
    subprocess.run(["bash", str(DOWN)], capture_output=True, env=env, timeout=200)
    for line in _stand_ins_alive(bin_dir):
        os.kill(int(line.split()[0]), 9)
    shutil.rmtree(state, ignore_errors=True)
    back = _up({})
    assert back.returncode == 0, back.stdout + back.stderr


def test_up_restarts_a_slurmd_that_never_registers(own_cluster):
    state, bin_dir = own_cluster
    run = _up_with_stand_in(state, bin_dir, silent_starts=1, register_s=5, wait_s=60)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    # the controller was up before slurmd started
    assert out.index("starting slurmctld") < out.index("starting slurmd")
    assert "restarting slurmd so it registers again (retry 1 of 2)" in out, out
    assert "retry 2 of 2" not in out, out
    assert (bin_dir / "starts").read_text().strip() == "2"
    assert "node " in out and " is idle" in out
    node = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%t"], capture_output=True, text=True, timeout=30
    )
    assert node.stdout.strip() == "idle", node.stdout + node.stderr
    # the silent stand-in was stopped, not left behind
    assert _stand_ins_alive(bin_dir) == []


def test_up_gives_up_with_the_reason_last(own_cluster):
    state, bin_dir = own_cluster
    run = _up_with_stand_in(state, bin_dir, silent_starts=99, register_s=4, wait_s=15)
    assert run.returncode == 1, run.stdout + run.stderr
    err = run.stderr.strip().splitlines()
    # both retries were spent, then it gave up
    assert "retry 2 of 2" in run.stdout, run.stdout
    assert (bin_dir / "starts").read_text().strip() == "3"
    # the reason is the very last line, after the per-daemon summary, so a CI log's tail has it
    assert err[-1].startswith("slurm up: ERROR: node ") and "not idle after 15s" in err[-1], err[-8:]
    assert "slurmd restarted 2 time(s)" in err[-1]
    summary = err.index("----- why (last error/registration lines of each daemon log) -----")
    assert [line.split(":")[0] for line in err[summary + 1 : summary + 4]] == [
        "munged.log",
        "slurmctld.log",
        "slurmd.log",
    ]
    # the known-harmless PMIx lines are not in what it printed
    assert "can not load PMIx library" not in run.stderr
    # nothing of the failed start is left running
    assert _stand_ins_alive(bin_dir) == []
    for pidfile in ("slurmctld.pid", "munge/munged.pid", "slurmd.pid"):
        assert not (state / pidfile).exists(), pidfile
