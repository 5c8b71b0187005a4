"""The persistent worker: real worker processes, real sockets and locks, a tiny real loader
(tests/worker_targets.py, put on the workers' PYTHONPATH)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from safetyrepro.errors import CellError, ModelError, SafetyReproError
from safetyrepro.worker import (WorkerCallError, WorkerCrashed, WorkerLoadError, WorkerStartError,
                                format_summary,
                                make_key, run_in_worker, stop_workers, summarize_events,
                                worker_status)
from safetyrepro.worker.events import read_events
from safetyrepro.procs import pid_alive
from safetyrepro.worker.layout import MAX_SOCKET_PATH, WorkerPaths, default_state_dir
from safetyrepro.worker.locks import lock_is_held
from safetyrepro.worker.pidfiles import read_pid_file
from safetyrepro.worker.spec import installed_sources_stamp, spec_hash

ROOT = Path(__file__).resolve().parents[2]
PYTHONPATH = os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")])
# The test switch: workers started by these tests may also run worker_targets' functions.
ENV = dict(os.environ, PYTHONPATH=PYTHONPATH, SAFETYREPRO_WORKER_TEST_TARGETS="worker_targets")
LOADER = "worker_targets:load"
LOAD_DELAY = 0.2


def call(state_dir, key, target, kwargs=None, *, tag=None, load_delay=LOAD_DELAY, **kw):
    kw.setdefault("idle_timeout", 30)
    return run_in_worker(state_dir, key, LOADER, {"tag": tag or key, "delay": load_delay},
                         f"worker_targets:{target}", kwargs or {}, env=ENV, **kw)


def events(state_dir, kind=None):
    evs, skipped = read_events(Path(state_dir) / "events.jsonl")
    assert skipped == 0
    return [e for e in evs if kind is None or e["event"] == kind]


def wait_until(pred, timeout=10.0, step=0.02):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(step)
    return pred()


def live_worker_pids(state_dir):
    return sorted(r["pid"] for r in worker_status(state_dir) if r.get("alive"))


@pytest.fixture(autouse=True)
def device_dir(tmp_path, monkeypatch):
    """Each test its own node-wide device-lock folder (another session's run on this machine
    must not make a test wait, nor a test stop it)."""
    d = tmp_path / "devices"
    monkeypatch.setenv("SAFETYREPRO_DEVICE_LOCK_DIR", str(d))
    monkeypatch.setitem(ENV, "SAFETYREPRO_DEVICE_LOCK_DIR", str(d))
    return d


@pytest.fixture
def sd(tmp_path):
    d = tmp_path / "w"
    yield d
    stop_workers(d, timeout=5)


CLIENT_SCRIPT = """
import json, sys
from safetyrepro.worker import run_in_worker
state_dir, env_path = sys.argv[1], sys.argv[2]
env = json.load(open(env_path))
out = []
for key, target, kwargs in json.loads(sys.argv[3]):
    out.append(run_in_worker(state_dir, key, "worker_targets:load", {"tag": key, "delay": 0.2},
                             "worker_targets:" + target, kwargs, env=env, idle_timeout=30))
print(json.dumps(out))
"""


def start_client(tmp_path, state_dir, calls):
    env_path = tmp_path / "env.json"
    env_path.write_text(json.dumps(ENV))
    return subprocess.Popen([sys.executable, "-c", CLIENT_SCRIPT, str(state_dir), str(env_path),
                             json.dumps(calls)], env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish_client(proc, timeout=60):
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


# ---- reuse, errors, crashes -------------------------------------------------------------

def test_second_call_reuses_the_worker(sd):
    r1 = call(sd, "m1", "echo", {"value": 1}, label="cell-1")
    r2 = call(sd, "m1", "echo", {"value": [2, "x"]}, label="cell-2")
    assert r1["value"] == 1 and r2["value"] == [2, "x"]
    assert r1["pid"] == r2["pid"] != os.getpid()
    assert (r1["calls"], r2["calls"]) == (1, 2)          # the same state object
    assert len(events(sd, "load")) == 1
    assert [e["label"] for e in events(sd, "call")] == ["cell-1", "cell-2"]
    info = read_pid_file(WorkerPaths(sd, "m1").pid)
    assert info["pid"] == r1["pid"] and Path(info["sock"]).exists()


def test_exception_is_reported_and_worker_keeps_serving(sd):
    pid = call(sd, "m1", "echo")["pid"]
    with pytest.raises(WorkerCallError) as ei:
        call(sd, "m1", "fail", {"message": "item bbq/Age/3 broke"}, label="cell-9")
    err = ei.value
    assert isinstance(err, CellError)
    assert err.error_type == "ValueError" and err.remote_message == "item bbq/Age/3 broke"
    assert "cell-9" in str(err) and "item bbq/Age/3 broke" in str(err) and not err.fatal
    assert "worker_targets.py" in err.remote_traceback
    with pytest.raises(WorkerCallError, match="not JSON-serializable"):
        call(sd, "m1", "not_json")
    with pytest.raises(WorkerCallError) as ei:
        call(sd, "m1", "no_such_target")
    assert ei.value.error_type == "AttributeError"
    assert call(sd, "m1", "echo")["pid"] == pid
    oks = [e["ok"] for e in events(sd, "call")]
    assert oks == [True, False, False, False, True]
    assert len(events(sd, "load")) == 1


def test_crash_fails_the_call_clearly_and_the_rerun_recovers(sd):
    pid1 = call(sd, "m1", "echo")["pid"]
    with pytest.raises(WorkerCrashed) as ei:
        call(sd, "m1", "crash", label="cell qwen/bbq/T1-greedy-k0-freeform")
    msg = str(ei.value)
    assert isinstance(ei.value, CellError)
    assert "worker for m1" in msg and "died" in msg and f"pid {pid1}" in msg
    assert "cell qwen/bbq/T1-greedy-k0-freeform" in msg
    assert "call worker_targets:crash" in msg                       # the log tail is quoted
    assert wait_until(lambda: not pid_alive(pid1), 5)
    paths = WorkerPaths(sd, "m1")
    assert not paths.pid.exists() and not paths.sock.exists()       # stale files cleaned
    r = call(sd, "m1", "echo", {"value": "again"})
    assert r["value"] == "again" and r["pid"] != pid1 and r["calls"] == 1
    assert len(events(sd, "load")) == 2


def test_killed_idle_worker_is_replaced(sd):
    pid1 = call(sd, "m1", "echo")["pid"]
    os.kill(pid1, signal.SIGKILL)
    assert wait_until(lambda: not pid_alive(pid1), 5)
    assert WorkerPaths(sd, "m1").sock.exists()                      # stale socket left behind
    r = call(sd, "m1", "echo")
    assert r["pid"] != pid1


def test_fatal_error_answers_then_worker_exits(sd):
    pid1 = call(sd, "m1", "echo")["pid"]
    with pytest.raises(WorkerCallError) as ei:
        call(sd, "m1", "fail_fatal")
    assert ei.value.fatal and "fresh one" in str(ei.value)
    assert wait_until(lambda: not pid_alive(pid1), 5)
    assert call(sd, "m1", "echo")["pid"] != pid1


def test_load_failure_is_a_model_error_and_the_worker_exits(sd):
    with pytest.raises(WorkerLoadError) as ei:
        run_in_worker(sd, "bad", LOADER, {"tag": "bad", "delay": 0.05, "fail": True},
                      "worker_targets:echo", {}, env=ENV)
    assert isinstance(ei.value, ModelError)
    assert "weights missing" in str(ei.value) and "loading bad" in str(ei.value)
    loads = events(sd, "load")
    assert len(loads) == 1 and loads[0]["ok"] is False
    assert wait_until(lambda: not live_worker_pids(sd), 5)


# ---- lifetime -------------------------------------------------------------------------------

def test_idle_timeout_exits_and_cleans_up(sd):
    pid = call(sd, "m1", "echo", idle_timeout=0.5)["pid"]
    paths = WorkerPaths(sd, "m1")
    assert wait_until(lambda: not pid_alive(pid), 10)
    assert not paths.pid.exists() and not paths.sock.exists()
    assert not lock_is_held(paths.key_lock) and not lock_is_held(paths.device_lock(0))
    (ex,) = events(sd, "exit")
    assert ex["pid"] == pid and ex["reason"].startswith("idle") and ex["n_calls"] == 1


# A process whose main thread has exited while another thread runs: the leader is a zombie,
# the process (its descriptors and flocks) lives until the other thread ends.
_LINGERING = """
import ctypes, fcntl, os, sys, threading, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
def linger():
    while not os.path.exists(sys.argv[2]):
        time.sleep(0.02)
    os._exit(0)
threading.Thread(target=linger).start()
ctypes.CDLL(None).pthread_exit(None)
"""


def _task_state(pid):
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_process_is_alive_until_its_last_thread_is_gone(tmp_path):
    """What made test_idle_timeout_exits_and_cleans_up flaky: in a multi-threaded exit the
    leader is a zombie before the last thread closes the descriptors, so a zombie leader read
    as "exited" while the device lock was still held."""
    from safetyrepro.sysutil import hostname, sweep_stale_tmp

    lock, go = tmp_path / "device.lock", tmp_path / "go"
    proc = subprocess.Popen([sys.executable, "-c", _LINGERING, str(lock), str(go)])
    try:
        assert wait_until(lambda: lock_is_held(lock) and _task_state(proc.pid) == "Z", 10)
        assert len(os.listdir(f"/proc/{proc.pid}/task")) == 2
        assert pid_alive(proc.pid) and lock_is_held(lock)
        # a temp file of that process is a live writer's, not a left-over
        target = tmp_path / "out.parquet"
        tmp = tmp_path / f".out.parquet.{hostname()}.{proc.pid}.x.tmp"   # the name atomic_write gives it
        tmp.write_bytes(b"partial")
        assert sweep_stale_tmp(target) == [] and tmp.exists()
        go.touch()
        # unreaped (the test has not waited for it): a zombie with no thread left is dead
        assert wait_until(lambda: os.listdir(f"/proc/{proc.pid}/task") == [str(proc.pid)], 10)
        assert _task_state(proc.pid) == "Z"
        assert not pid_alive(proc.pid) and not lock_is_held(lock)
        assert sweep_stale_tmp(target) == [tmp] and not tmp.exists()
    finally:
        go.touch()
        proc.wait(10)
    assert not pid_alive(proc.pid)


def test_stop_and_sigterm_drain_queued_calls(sd):
    pid = call(sd, "m1", "echo")["pid"]
    results = {}

    def run(name, target, kwargs):
        results[name] = call(sd, "m1", target, kwargs)

    t1 = threading.Thread(target=run, args=("slow", "sleep", {"seconds": 0.6}))
    t1.start()
    assert wait_until(lambda: len(events(sd, "call")) >= 1 and
                      "call worker_targets:sleep" in WorkerPaths(sd, "m1").log.read_text(), 5)
    t2 = threading.Thread(target=run, args=("queued", "echo", {"value": 5}))
    t2.start()
    assert wait_until(lambda: worker_status(sd)[0].get("queued") == 1, 5)   # behind the slow call
    rows = stop_workers(sd, timeout=10)
    t1.join(10)
    t2.join(10)
    assert rows == [{"key": "m1", "pid": pid, "outcome": "stopped"}]
    assert results["slow"] == pid and results["queued"]["pid"] == pid   # both were served
    assert events(sd, "exit")[-1]["reason"] == "stop requested"
    # SIGTERM is a graceful stop too
    pid2 = call(sd, "m1", "echo")["pid"]
    os.kill(pid2, signal.SIGTERM)
    assert wait_until(lambda: not pid_alive(pid2), 5)
    assert events(sd, "exit")[-1]["reason"] == f"signal {int(signal.SIGTERM)}"


def test_worker_survives_its_client_being_killed(sd, tmp_path):
    pid = call(sd, "m1", "echo")["pid"]
    proc = start_client(tmp_path, sd, [["m1", "sleep", {"seconds": 0.8}]])
    assert wait_until(lambda: "call worker_targets:sleep" in WorkerPaths(sd, "m1").log.read_text(), 10)
    proc.kill()
    proc.wait()
    r = call(sd, "m1", "echo")
    assert r["pid"] == pid and r["calls"] == 3                       # sleep ran to its end
    assert len(events(sd, "load")) == 1


# ---- exclusivity ------------------------------------------------------------------------

def test_other_key_shuts_down_the_first_worker(sd):
    pa = call(sd, "ma", "echo")["pid"]
    rb = call(sd, "mb", "echo")
    pb = rb["pid"]
    assert rb["tag"] == "mb" and pb != pa
    assert wait_until(lambda: not pid_alive(pa), 2)
    assert live_worker_pids(sd) == [pb]
    exit_a = next(e for e in events(sd, "exit") if e["pid"] == pa)
    dev_b = next(e for e in events(sd, "device") if e["pid"] == pb)
    assert exit_a["reason"] == "device needed for mb"
    assert dev_b["t"] >= exit_a["t"]                  # B took the device only after A left
    pa2 = call(sd, "ma", "echo")["pid"]
    assert pa2 not in (pa, pb) and live_worker_pids(sd) == [pa2]


def _device_flock_holders(lock_path: Path) -> int:
    try:
        ino = os.stat(lock_path).st_ino
    except FileNotFoundError:
        return 0
    n = 0
    for line in Path("/proc/locks").read_text().splitlines():
        f = line.split()
        if "->" not in line and len(f) >= 6 and f[1] == "FLOCK" and f[5].endswith(f":{ino}"):
            n += 1
    return n


def test_device_lock_is_never_held_by_two_under_concurrent_clients(sd, tmp_path):
    call(sd, "ma", "echo")                                  # creates device.lock
    dev = WorkerPaths(sd, "ma").device_lock(0)
    assert _device_flock_holders(dev) == 1                  # the probe sees a real holder
    samples, stop = [], threading.Event()

    def sample():
        while not stop.is_set():
            samples.append(_device_flock_holders(dev))
            time.sleep(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    plans = [[["ma", "sleep", {"seconds": 0.05}], ["mb", "echo", {}], ["mc", "echo", {}]],
             [["mb", "echo", {}], ["mc", "sleep", {"seconds": 0.05}], ["ma", "echo", {}]],
             [["mc", "echo", {}], ["ma", "echo", {}], ["mb", "sleep", {"seconds": 0.05}]]]
    procs = [start_client(tmp_path, sd, plan) for plan in plans]
    outs = [finish_client(p) for p in procs]
    stop.set()
    sampler.join()
    assert all(len(o) == 3 for o in outs)
    assert max(samples) == 1 and len(samples) > 50
    # From the events: device hold intervals [device acquired, exit] never overlap.
    held = {}
    for e in events(sd):
        if e["event"] == "device":
            held[e["pid"]] = [e["t"], None]
        elif e["event"] == "exit" and e["pid"] in held:
            held[e["pid"]][1] = e["t"]
    intervals = sorted((a, b if b is not None else float("inf")) for a, b in held.values())
    assert len(intervals) >= 3
    for (a1, b1), (a2, _) in zip(intervals, intervals[1:]):
        assert b1 <= a2, intervals
    assert len(live_worker_pids(sd)) <= 1
    # Nobody waited for an idle holder that was never asked to leave.
    assert max(e["waited_s"] for e in events(sd, "device")) < 5


def test_concurrent_clients_for_one_key_start_one_worker(sd, tmp_path):
    procs = [start_client(tmp_path, sd, [["m1", "echo", {"value": i}]]) for i in range(3)]
    outs = [finish_client(p)[0] for p in procs]
    assert len({o["pid"] for o in outs}) == 1
    assert sorted(o["calls"] for o in outs) == [1, 2, 3]
    assert len(events(sd, "load")) == 1 and len(events(sd, "start")) == 1


def test_two_device_slots_allow_two_workers(sd):
    pa = call(sd, "ma", "echo", max_workers=2)["pid"]
    pb = call(sd, "mb", "echo", max_workers=2)["pid"]
    assert pid_alive(pa) and pid_alive(pb) and live_worker_pids(sd) == sorted([pa, pb])
    assert sorted(e["slot"] for e in events(sd, "device")) == [0, 1]
    call(sd, "mb", "echo", max_workers=2)                      # mb is now the less idle one
    pc = call(sd, "mc", "echo", max_workers=2)["pid"]
    assert wait_until(lambda: not pid_alive(pa), 5)            # the most idle one made room
    assert live_worker_pids(sd) == sorted([pb, pc])


def test_changed_loader_args_replace_the_worker(sd):
    r1 = call(sd, "m1", "echo", tag="first")
    r2 = call(sd, "m1", "echo", tag="second")
    assert (r1["tag"], r2["tag"]) == ("first", "second") and r1["pid"] != r2["pid"]
    assert wait_until(lambda: not pid_alive(r1["pid"]), 5)


def test_code_stamp_tracks_source_edits(tmp_path):
    # A worker's spec covers the code stamp, so edited sources replace the worker the same
    # way changed loader arguments do (test above). Checked on a copy, not the live tree.
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "a.py").write_text("x = 1\n")
    (pkg / "sub" / "b.py").write_text("y = 2\n")
    (pkg / "notes.txt").write_text("not code")
    s1 = installed_sources_stamp(pkg)
    assert installed_sources_stamp(pkg) == s1
    (pkg / "notes.txt").write_text("still not code")
    assert installed_sources_stamp(pkg) == s1
    st = os.stat(pkg / "sub" / "b.py")
    os.utime(pkg / "sub" / "b.py", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    s2 = installed_sources_stamp(pkg)
    assert s2 != s1
    (pkg / "c.py").write_text("")
    s3 = installed_sources_stamp(pkg)
    assert s3 not in (s1, s2)
    # a task file edited with a worker alive replaces the worker too (it would keep the old one)
    (pkg / "sub" / "task.yaml").write_text("templates: {}\n")
    assert installed_sources_stamp(pkg) not in (s1, s2, s3)
    assert spec_hash(LOADER, {"a": 1}, stamp=s1) != spec_hash(LOADER, {"a": 1}, stamp=s2)
    assert spec_hash(LOADER, {"a": 1}, stamp=s1) == spec_hash(LOADER, {"a": 1}, stamp=s1)


def test_long_state_dir_uses_a_short_socket_path(tmp_path):
    d = tmp_path / ("x" * 60) / ("y" * 60)
    try:
        r = call(d, "m1", "echo")
        info = read_pid_file(WorkerPaths(d, "m1").pid)
        assert len(str(d / "m1.sock")) > MAX_SOCKET_PATH
        assert len(info["sock"]) <= MAX_SOCKET_PATH and Path(info["sock"]).exists()
        assert call(d, "m1", "echo")["pid"] == r["pid"]
    finally:
        stop_workers(d, timeout=5)


def test_keys_are_validated(sd):
    with pytest.raises(ValueError, match="invalid worker key"):
        call(sd, "../evil", "echo")
    assert make_key("qwen2.5-0.5b", "nf4", "3f2a/9") == "qwen2.5-0.5b.nf4.3f2a_9"
    assert default_state_dir("/r", host="node7") in (Path("/r/.workers/node7"),
                                                     Path(os.environ.get("SAFETYREPRO_WORKER_DIR", "/")) / "node7")


# ---- events and summary ---------------------------------------------------------------------

def test_summary_of_a_real_run_counts_loads(sd):
    call(sd, "ma", "echo")
    call(sd, "ma", "echo")
    call(sd, "mb", "sleep", {"seconds": 0.3})
    call(sd, "ma", "echo")
    s = summarize_events(sd / "events.jsonl")
    assert s["keys"]["ma"]["loads"] == 2 and s["keys"]["mb"]["loads"] == 1
    assert s["keys"]["ma"]["calls"] == 3 and s["keys"]["mb"]["calls"] == 1
    assert s["loads"] == 3 and s["max_loads_per_key"] == 2
    assert 3 * LOAD_DELAY <= s["load_seconds"] < 3 * LOAD_DELAY + 1.0
    assert s["keys"]["mb"]["call_seconds"] >= 0.3
    assert 0 < s["load_share"] < 1 and s["wall_seconds"] >= s["load_seconds"] + 0.3
    assert "model loads: 3 (max 2 per key)" in format_summary(s)


def test_summary_arithmetic_on_written_events(tmp_path):
    path = tmp_path / "events.jsonl"
    recs = [
        {"event": "load", "key": "old", "pid": 1, "t_start": 50.0, "t": 60.0, "seconds": 10.0, "ok": True},
        {"event": "start", "key": "a", "pid": 2, "t": 100.0},
        {"event": "load", "key": "a", "pid": 2, "t_start": 100.0, "t": 104.0, "seconds": 4.0, "ok": True},
        {"event": "call", "key": "a", "pid": 2, "t_start": 104.0, "t": 150.0, "seconds": 46.0, "ok": True},
        {"event": "load", "key": "b", "pid": 3, "t_start": 150.0, "t": 151.0, "seconds": 1.0, "ok": False},
        {"event": "load", "key": "b", "pid": 4, "t_start": 160.0, "t": 166.0, "seconds": 6.0, "ok": True},
        {"event": "call", "key": "b", "pid": 4, "t_start": 166.0, "t": 200.0, "seconds": 34.0, "ok": False},
        {"event": "exit", "key": "b", "pid": 4, "t": 200.0, "reason": "idle"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n{\"event\": \"call\", \"key\n")
    s = summarize_events(path, since=100.0)
    assert s["skipped_lines"] == 1 and "old" not in s["keys"]
    assert s["keys"]["a"] == {"loads": 1, "failed_loads": 0, "load_seconds": 4.0, "calls": 1,
                              "failed_calls": 0, "call_seconds": 46.0, "device_wait_seconds": 0.0,
                              "workers": 1, "exits": {}}
    assert s["keys"]["b"]["loads"] == 1 and s["keys"]["b"]["failed_loads"] == 1
    assert s["keys"]["b"]["load_seconds"] == 7.0 and s["keys"]["b"]["workers"] == 2
    assert s["keys"]["b"]["exits"] == {"idle": 1} and s["keys"]["b"]["failed_calls"] == 1
    assert s["wall_seconds"] == 100.0 and s["load_share"] == pytest.approx(0.11)
    assert summarize_events(path, since=100.0, wall_seconds=220.0)["load_share"] == pytest.approx(0.05)
    assert summarize_events(path)["loads"] == 3
    assert summarize_events(tmp_path / "missing.jsonl")["loads"] == 0


# ---- light client, CLI ------------------------------------------------------------------

def test_client_import_does_not_pull_heavy_modules():
    code = ("import sys, safetyrepro.worker, safetyrepro.worker.client; "
            "heavy = {'torch', 'transformers', 'numpy', 'pyarrow', 'pandas', 'typer', 'yaml'}; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))")
    out = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"


def test_cli_worker_group(sd):
    import typer
    from typer.testing import CliRunner

    from safetyrepro.worker.cli import register

    app = typer.Typer()
    register(app)

    @app.command()
    def version() -> None:  # a second command so that "worker" stays a sub-command
        pass

    pid = call(sd, "m1", "echo")["pid"]
    runner = CliRunner()
    res = runner.invoke(app, ["worker", "status", "--state-dir", str(sd)])
    assert res.exit_code == 0 and f"m1\tpid {pid}\tready" in res.output
    res = runner.invoke(app, ["worker", "events-summary", "--events", str(sd / "events.jsonl"), "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["keys"]["m1"]["loads"] == 1
    res = runner.invoke(app, ["worker", "stop", "--state-dir", str(sd), "--all"])
    assert res.exit_code == 0 and f"m1\tpid {pid}\tstopped" in res.output
    assert not pid_alive(pid)
    assert issubclass(WorkerCrashed, SafetyReproError)


def test_stop_kills_a_stuck_worker_and_ignores_foreign_pids(sd):
    pid = call(sd, "m1", "echo")["pid"]
    caught = []

    def stuck():
        try:
            call(sd, "m1", "sleep", {"seconds": 5}, label="cell-stuck")
        except Exception as exc:  # noqa: BLE001 - inspected below
            caught.append(exc)

    t = threading.Thread(target=stuck)
    t.start()
    assert wait_until(lambda: worker_status(sd)[0].get("busy"), 5)
    # A pid file naming a live process that is not a worker (pid reuse) must not be signalled.
    ghost = WorkerPaths(sd, "ghost").pid
    ghost.write_text(json.dumps({"pid": os.getpid(), "key": "ghost"}))
    rows = {r["key"]: r for r in stop_workers(sd, timeout=0.3)}
    t.join(10)
    assert rows["m1"] == {"key": "m1", "pid": pid, "outcome": "killed"}
    assert rows["ghost"]["outcome"] == "stale" and not ghost.exists()
    assert len(caught) == 1 and isinstance(caught[0], WorkerCrashed)
    assert "cell-stuck" in str(caught[0])


# ---- the cell job's client process ----------------------------------------------------------

def test_cell_client_imports_only_what_a_running_worker_needs():
    """Every cell job starts this process; modules it does not need cost start-up time ~1,800
    times per run (argparse, subprocess, typing, tempfile: ~30 ms together here; dataclasses
    with inspect another ~10 ms)."""
    code = ("import sys, safetyrepro.cell_client, safetyrepro.worker.client; "
            "print(sorted(m for m in ('argparse', 'subprocess', 'typing', 'tempfile', 'signal', "
            "'dataclasses', 'inspect', 'torch', 'numpy', 'safetyrepro.worker.events') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    # the package's lazy exports still resolve
    import safetyrepro.worker as w
    assert w.summarize_events.__module__ == "safetyrepro.worker.events"
    with pytest.raises(AttributeError):
        w.no_such_name


def test_cell_client_arguments_are_checked():
    from safetyrepro.cell_client import REQUIRED, UsageError, main, parse_args, requests_from_args

    def value(n):
        return {"seed": "7", "idle-timeout": "5", "decode-group": "greedy:1,t0.3:5"}.get(n, f"v-{n}")

    full = [x for n in REQUIRED for x in (f"--{n}", value(n))]
    opts = parse_args(full[:-2] + [f"--device-wait={value('device-wait')}"])
    assert opts["seed"] == ["7"] and opts["idle-timeout"] == "5" and opts["device-wait"] == "v-device-wait"
    assert opts["variant"] == "v-variant" and opts["items"] == "v-items" and opts["state-root"] == "v-state-root"
    (request,) = requests_from_args(opts)
    assert request.seed == 7 and request.decode_group == (("greedy", 1), ("t0.3", 5))
    assert request.config_id == "v-config-id" and request.model_marker.endswith("/v-model-marker")
    # a group job: the per-cell options once per cell, in order; the rest shared
    second = ["--config-id", "T1-t0.3-k0-freeform", "--seed", "3", "--fingerprint", "fp2", "--out", "o2"]
    first, other = requests_from_args(parse_args(full + second))
    assert (first.config_id, first.seed, first.out) == ("v-config-id", 7, request.out)
    assert (other.config_id, other.seed, other.fingerprint) == ("T1-t0.3-k0-freeform", 3, "fp2")
    assert other.out.endswith("/o2") and other.items == first.items and other.decode_group == first.decode_group
    for bad, msg in ((full[2:], "missing --config$"), (full + ["--seeds", "1"], "unknown option --seeds"),
                     (full + ["--seed", "2"], r"once per cell.*2 --seed, 1 --fingerprint"),
                     (full + ["--model", "m2"], "--model given twice"), (full + ["extra"], "unexpected argument"),
                     (full[:-1], "needs a value")):
        with pytest.raises(UsageError, match=msg):
            parse_args(bad)
    seed_at = full.index("--seed") + 1
    assert main(full[:seed_at] + ["x"] + full[seed_at + 1:]) == 2          # a seed that is not an integer
    group_at = full.index("--decode-group") + 1
    for bad_group in ("greedy", "greedy:0", "greedy:1,"):
        assert main(full[:group_at] + [bad_group] + full[group_at + 1:]) == 2
    assert main(["--help"]) == 0


def test_a_cell_request_travels_as_data():
    """What the client sends is what the worker reads back; a malformed message is refused."""
    from safetyrepro.cell_request import CellRequest, format_decode_group, parse_decode_group

    req = CellRequest(model="m", variant="main", quantization="nf4", benchmark="bbq",
                      config_id="T1-t0.3-k0-freeform", seed=2, decode_group=(("greedy", 1), ("t0.3", 5)),
                      config_path="/c.yaml", rules="/r.yaml", items="/i", fewshot="/f", model_marker="/m.json",
                      out="/o.parquet", fingerprint="ab" * 32)
    message = json.loads(json.dumps(req.as_message()))
    assert CellRequest.from_message(message) == req
    assert parse_decode_group(format_decode_group(req.decode_group)) == req.decode_group
    for broken in ({**message, "extra": 1}, {k: v for k, v in message.items() if k != "items"},
                   {**message, "decode_group": [["greedy"]]}, [message]):
        with pytest.raises(ValueError):
            CellRequest.from_message(broken)


# ---- who may connect, what may be run (issue 15) ---------------------------------------------

def _raw_exchange(sock_path, request):
    """Connect as a foreign client would, read the hello, send ``request``; the reply."""
    import socket as _socket

    from safetyrepro.worker.protocol import recv_message, send_message

    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(str(sock_path))
    try:
        hello = recv_message(s)
        send_message(s, request)
        return hello, recv_message(s)
    finally:
        s.close()


def test_a_forged_frame_naming_a_foreign_target_is_refused(sd, tmp_path):
    pid = call(sd, "m1", "echo")["pid"]
    marker = tmp_path / "pwned"
    # The pid file (all a forged hello needs) names the socket; the frame names pydoc's pager,
    # which would run a shell command.
    sock = read_pid_file(WorkerPaths(sd, "m1").pid)["sock"]
    hello, reply = _raw_exchange(sock, {"op": "call", "target": "pydoc:pipepager",
                                        "kwargs": {"cmd": f"touch {marker}"}})
    assert hello["pid"] == pid
    assert reply["ok"] is False and reply["error_type"] == "TargetNotAllowed"
    assert "pydoc:pipepager" in reply["message"]
    with pytest.raises(WorkerCallError) as ei:                      # through the client too
        run_in_worker(sd, "m1", LOADER, {"tag": "m1", "delay": LOAD_DELAY}, "os:system",
                      {"command": f"touch {marker}"}, env=ENV, idle_timeout=30)
    assert ei.value.error_type == "TargetNotAllowed"
    time.sleep(0.2)
    assert not marker.exists()
    assert call(sd, "m1", "echo")["pid"] == pid                     # the worker keeps serving
    assert [e["target"] for e in events(sd, "refused")] == ["pydoc:pipepager", "os:system"]


def test_without_the_test_switch_only_the_cell_call_runs(sd):
    env = {k: v for k, v in ENV.items() if k != "SAFETYREPRO_WORKER_TEST_TARGETS"}
    with pytest.raises(WorkerStartError, match="not a worker loader"):
        run_in_worker(sd, "m1", LOADER, {"tag": "m1"}, "worker_targets:echo", {}, env=env,
                      idle_timeout=30)


needs_root = pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as a second uid")
NOBODY = 65534


def _open_dir(tmp_root):
    """A state folder whose parents a second uid can traverse (pytest's are 0700)."""
    import tempfile

    d = Path(tempfile.mkdtemp(dir="/tmp", prefix="srw-"))
    os.chmod(d, 0o711)
    return d


@needs_root
def test_the_worker_refuses_a_second_uid(tmp_path):
    base = _open_dir(tmp_path)
    sd = base / "w"
    try:
        pid = call(sd, "m1", "echo")["pid"]
        sock = WorkerPaths(sd, "m1").sock
        os.chmod(sd, 0o711)                 # loosen what guards the socket, as a shared
        os.chmod(sock, 0o777)               # folder or a careless umask would
        child = os.fork()
        if child == 0:                      # a second user connects and sends a forged call
            code = 3
            try:
                os.setgid(NOBODY)
                os.setuid(NOBODY)
                import socket as _socket

                from safetyrepro.worker.protocol import ConnectionClosed, recv_message

                s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
                s.settimeout(10)
                s.connect(str(sock))
                try:
                    recv_message(s)
                    code = 1                # got a hello: the worker talked to uid 65534
                except ConnectionClosed:
                    code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(child, 0)
        assert os.WEXITSTATUS(status) == 0
        (ref,) = events(sd, "refused")
        assert ref["peer_uid"] == NOBODY and ref["pid"] == pid
        assert "refused a connection from pid" in WorkerPaths(sd, "m1").log.read_text()
        assert call(sd, "m1", "echo")["pid"] == pid
        assert (os.stat(sd).st_mode & 0o777) == 0o700                # put back on use
    finally:
        stop_workers(sd, timeout=5)
        import shutil
        shutil.rmtree(base, ignore_errors=True)


@needs_root
def test_the_client_refuses_a_socket_served_by_a_second_uid(sd):
    import socket as _socket

    paths = WorkerPaths(sd, "m1")
    paths.ensure_dir()
    r, w = os.pipe()
    child = os.fork()
    if child == 0:                          # a second user's process answers on the socket
        try:
            os.close(r)
            s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
            s.bind(str(paths.sock))
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            s.listen(1)                     # SO_PEERCRED reports the uid as of listen()
            os.write(w, b"x")
            conn, _ = s.accept()
            from safetyrepro.worker.protocol import send_message

            send_message(conn, {"hello": 1, "protocol": 1, "pid": os.getpid(), "key": "m1",
                                "spec": "forged", "phase": "ready"})
            time.sleep(2)
        finally:
            os._exit(0)
    os.close(w)
    assert os.read(r, 1) == b"x"
    try:
        with pytest.raises(SafetyReproError, match=f"of uid {NOBODY}, not by a worker of yours"):
            call(sd, "m1", "echo")
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


def test_state_folder_and_files_are_private(sd):
    sd.mkdir(parents=True)
    os.chmod(sd, 0o755)                     # made by an older version, or by hand
    call(sd, "m1", "echo")
    assert (os.stat(sd).st_mode & 0o777) == 0o700
    names = {p.name: os.stat(p).st_mode & 0o777 for p in sd.iterdir()}
    for name in ("m1.pid", "m1.lock", "m1.log", "start.lock", "events.jsonl"):
        assert names[name] == 0o600, (name, oct(names[name]))
    dev = WorkerPaths(sd, "m1").device_lock(0)
    assert os.stat(dev).st_mode & 0o777 == 0o600 and os.stat(dev.parent).st_mode & 0o777 == 0o700
    assert names["m1.sock"] & 0o077 == 0


def test_a_symlinked_state_folder_is_refused(tmp_path):
    real = tmp_path / "elsewhere"
    real.mkdir()
    link = tmp_path / "w"
    link.symlink_to(real)
    with pytest.raises(SafetyReproError, match=f"{link} is a symbolic link"):
        call(link, "m1", "echo")
    assert list(real.iterdir()) == []


@needs_root
def test_a_foreign_state_folder_is_refused_naming_its_owner(tmp_path):
    d = tmp_path / "w"
    d.mkdir(mode=0o777)
    os.chown(d, NOBODY, NOBODY)
    with pytest.raises(SafetyReproError, match=rf"{d} is owned by \S+ \(uid {NOBODY}\)"):
        call(d, "m1", "echo")
    assert list(d.iterdir()) == []


def test_a_planted_short_socket_folder_is_refused(tmp_path, monkeypatch):
    from safetyrepro.worker import layout
    from safetyrepro.worker.layout import short_socket_dir

    monkeypatch.setattr(layout, "SHORT_SOCKET_PARENT", str(tmp_path))
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / f"safetyrepro-{os.getuid()}").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(SafetyReproError, match="is a symbolic link"):
        short_socket_dir()


@pytest.mark.parametrize("name", ["device", "m1.lock", "start.lock", "m1.log"])
def test_a_planted_link_is_never_followed(sd, tmp_path, name):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    sd.mkdir(parents=True, mode=0o700)
    planted = WorkerPaths(sd, "m1").device_lock(0) if name == "device" else sd / name
    planted.symlink_to(victim)
    with pytest.raises(SafetyReproError, match=f"{planted} is a symbolic link"):
        call(sd, "m1", "echo")
    assert victim.read_text() == "precious\n"


def test_a_planted_events_link_is_not_followed_and_the_call_still_runs(sd, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    sd.mkdir(parents=True, mode=0o700)
    (sd / "events.jsonl").symlink_to(victim)
    assert call(sd, "m1", "echo", {"value": 4})["value"] == 4
    assert victim.read_text() == "precious\n"
    assert "events.jsonl is a symbolic link" in WorkerPaths(sd, "m1").log.read_text()


# ---- shards: durable, swept, readable by collaborators (issue 15) -----------------------------

def test_worker_killed_inside_the_shard_write_leaves_no_shard_and_the_rerun_sweeps(sd, tmp_path):
    from safetyrepro.io import read_parquet

    shards = tmp_path / "shards"
    done = shards / "s0.parquet"
    assert call(sd, "m1", "write_table", {"out": str(done), "n": 10})     # a finished shard
    before = done.read_bytes()
    out = shards / "s1.parquet"
    marker = tmp_path / "in-fsync"
    caught = []

    def run():
        try:
            call(sd, "m1", "write_table", {"out": str(out), "n": 5000,
                                           "hang_before_rename": str(marker)})
        except Exception as exc:  # noqa: BLE001 - inspected below
            caught.append(exc)

    t = threading.Thread(target=run)
    t.start()
    assert wait_until(marker.exists, 20)
    pid = read_pid_file(WorkerPaths(sd, "m1").pid)["pid"]
    os.kill(pid, signal.SIGKILL)                       # inside the write: data in the temp file
    t.join(20)
    assert len(caught) == 1 and isinstance(caught[0], WorkerCrashed)
    assert not out.exists()                            # nothing under the final name
    left = list(shards.glob(".s1.parquet.*.tmp"))
    assert len(left) == 1 and left[0].stat().st_size > 0
    assert call(sd, "m1", "write_table", {"out": str(out), "n": 5000}) == str(out)   # the rerun
    assert list(shards.glob(".s1.parquet.*.tmp")) == []                 # left-over swept
    assert read_parquet(out)[0].num_rows == 5000
    assert done.read_bytes() == before                                  # nothing lost


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_shards_and_tables_respect_the_umask(tmp_path, umask, mode):
    import pyarrow as pa

    from safetyrepro.io import write_parquet
    from safetyrepro.sysutil import atomic_write_text

    old = os.umask(umask)
    try:
        write_parquet(pa.table({"x": [1]}), tmp_path / "a.parquet", {"kind": "test"})
        atomic_write_text(tmp_path / "a.json", "{}")
    finally:
        os.umask(old)
    assert os.stat(tmp_path / "a.parquet").st_mode & 0o777 == mode
    assert os.stat(tmp_path / "a.json").st_mode & 0o777 == mode


def test_cell_job_refuses_a_shard_that_does_not_read_back(tmp_path):
    from safetyrepro.cell_client import check_shard_file

    p = tmp_path / "s.parquet"
    assert "cannot read it back" in check_shard_file(str(p))
    p.write_bytes(b"")                                   # zero-length under the final name
    assert "0 bytes" in check_shard_file(str(p))
    import pyarrow as pa

    from safetyrepro.io import write_parquet
    write_parquet(pa.table({"x": [1, 2]}), p, {"kind": "test"})
    assert check_shard_file(str(p)) is None
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])                # cut short
    assert "complete Parquet" in check_shard_file(str(p))


# ---- deadlines and the device (issue 15) ------------------------------------------------------

def test_a_hung_call_fails_at_its_deadline_and_the_worker_exits(sd):
    pid = call(sd, "m1", "echo")["pid"]
    t0 = time.monotonic()
    with pytest.raises(WorkerCallError) as ei:
        call(sd, "m1", "sleep", {"seconds": 600}, label="cell qwen/bbq/T4-t0.7-k5-freeform/s3",
             call_timeout=1.0)
    assert time.monotonic() - t0 < 20
    msg = str(ei.value)
    assert ei.value.fatal and ei.value.error_type == "CellTimeout"
    assert "cell qwen/bbq/T4-t0.7-k5-freeform/s3 ran past its deadline of 1 s" in msg
    assert "runtime.cell_timeout_s" in msg
    assert wait_until(lambda: not pid_alive(pid), 10)
    (to,) = events(sd, "timeout")
    assert to["pid"] == pid and to["timeout_s"] == 1.0
    assert not WorkerPaths(sd, "m1").sock.exists() and not WorkerPaths(sd, "m1").pid.exists()
    r = call(sd, "m1", "echo", {"value": 2}, call_timeout=30)        # a fresh worker serves
    assert r["pid"] != pid and r["value"] == 2


def test_a_call_whose_watchdog_cannot_run_is_killed_by_the_client(sd, monkeypatch):
    """A call stuck in C code that keeps the GIL also stops the worker's watchdog thread:
    the client waits the deadline plus its grace, SIGKILLs the worker, removes its socket
    and pid file and fails the call saying so; the device lock dies with the process, so a
    fresh worker serves the next call."""
    import safetyrepro.worker.client as client

    monkeypatch.setattr(client, "WATCHDOG_GRACE_S", 2.0)
    pid = call(sd, "m1", "echo")["pid"]
    t0 = time.monotonic()
    with pytest.raises(WorkerCallError) as ei:
        call(sd, "m1", "hold_gil", {"seconds": 600}, label="cell qwen/bbq/T1-greedy-k0-freeform/s0",
             call_timeout=1.0)
    assert 3.0 <= time.monotonic() - t0 < 30
    msg = str(ei.value)
    assert ei.value.fatal and ei.value.error_type == "CallTimeout"
    assert "cell qwen/bbq/T1-greedy-k0-freeform/s0: no answer within 1 s" in msg
    assert f"plus 2 s: the worker for m1 (pid {pid}) was killed" in msg
    assert not pid_alive(pid)
    assert events(sd, "timeout") == []               # the watchdog never ran
    assert not WorkerPaths(sd, "m1").sock.exists() and not WorkerPaths(sd, "m1").pid.exists()
    r = call(sd, "m1", "echo", {"value": 3}, call_timeout=30)
    assert r["pid"] != pid and r["value"] == 3


def test_a_second_stale_answer_fails_the_call_without_a_third_worker(sd):
    """A worker that finds the call stale exits and the client retries once on a fresh
    worker; when that one answers stale too, the call fails naming both workers, and no
    third worker is started."""
    with pytest.raises(WorkerCallError) as ei:
        call(sd, "m1", "stale", label="cell m/xstest/T1-greedy-k0-freeform/s0")
    msg = str(ei.value)
    loads = events(sd, "load")
    assert len(loads) == 2 and loads[0]["pid"] != loads[1]["pid"]
    first, second = (e["pid"] for e in loads)
    assert f"stale for this call (worker pid {second})" in msg
    assert f"a fresh worker, pid {second}, found the same mismatch after the stale one, pid {first}" in msg
    assert "run the workflow again" in msg
    assert wait_until(lambda: not pid_alive(first) and not pid_alive(second), 10)
    assert sorted(e["pid"] for e in events(sd, "exit")) == sorted([first, second])
    assert live_worker_pids(sd) == []


def test_two_runs_on_one_device_never_hold_it_together(tmp_path):
    """Two runs (two results folders, so two state folders) on one node share the device lock:
    the second worker waits, and past runtime.device_wait_s fails naming the holder."""
    sd1, sd2 = tmp_path / "run1" / "w", tmp_path / "run2" / "w"
    try:
        pa = call(sd1, "ma", "echo", idle_timeout=30)["pid"]
        with pytest.raises(WorkerLoadError) as ei:
            call(sd2, "mb", "echo", device_wait=1.0)
        msg = str(ei.value)
        assert f"worker pid {pa} for ma (state folder {sd1.absolute()}" in msg
        assert "runtime.device_wait_s" in msg and pid_alive(pa)      # the other run's worker lives
        assert [e["event"] for e in events(sd2) if e["event"] in ("device", "device_timeout")] == \
            ["device_timeout"]
        # once the first run's worker leaves, the second run's worker takes the device
        stop_workers(sd1, timeout=10)
        pb = call(sd2, "mb", "echo", device_wait=30)["pid"]
        (dev_b,) = events(sd2, "device")
        exit_a = [e for e in events(sd1, "exit") if e["pid"] == pa][0]
        assert dev_b["t"] >= exit_a["t"] and dev_b["pid"] == pb
        # the end of run 1 stops only run 1's workers, not run 2's device holder
        rows = stop_workers(sd1, timeout=5)
        assert all(r["pid"] != pb for r in rows) and pid_alive(pb)
    finally:
        stop_workers(sd1, timeout=5)
        stop_workers(sd2, timeout=5)


def test_end_of_run_stops_only_workers_no_other_run_uses(sd, monkeypatch):
    from safetyrepro.worker.lifecycle import hold_run_lease, stop_run_workers

    lease_b = hold_run_lease(sd, "run-b")              # run B is still going
    monkeypatch.setenv("SAFETYREPRO_RUN_ID", "run-a")
    shared = call(sd, "m1", "echo", max_workers=2)["pid"]
    only_a = call(sd, "m2", "echo", max_workers=2)["pid"]
    monkeypatch.setenv("SAFETYREPRO_RUN_ID", "run-b")
    assert call(sd, "m1", "echo", max_workers=2)["pid"] == shared
    rows = {r["key"]: r for r in stop_run_workers(sd, "run-a", timeout=10)}   # run A ends
    assert rows["m1"]["outcome"] == "kept for run run-b" and pid_alive(shared)
    assert rows["m2"]["outcome"] == "stopped" and not pid_alive(only_a)
    assert call(sd, "m1", "echo", max_workers=2)["pid"] == shared              # B keeps its worker
    lease_b.release()                                  # run B's process is gone
    rows = {r["key"]: r for r in stop_run_workers(sd, "run-a", timeout=10)}
    assert rows["m1"]["outcome"] == "stopped" and not pid_alive(shared)
