"""The stdlib-only helpers: node name, atomic writes, package versions."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from safetyrepro.errors import WriteError
from safetyrepro.sysutil import (ABSENT, STALE_TMP_S, atomic_write, atomic_write_bytes, atomic_write_json,
                                 atomic_write_text, compile_bytecode, hostname, package_version,
                                 sweep_stale_tmp)


def test_hostname_is_the_short_name_and_a_safe_path_component(monkeypatch):
    monkeypatch.setattr(socket, "gethostname", lambda: "gpu-07.cluster.example.org")
    assert hostname() == "gpu-07"
    monkeypatch.setattr(socket, "gethostname", lambda: "node 3/a:b.x")
    assert hostname() == "node_3_a_b"
    monkeypatch.setattr(socket, "gethostname", lambda: "")
    assert hostname() == "localhost"


def test_package_version_of_an_installed_and_a_missing_distribution():
    import pytest as installed

    assert package_version("pytest") == installed.__version__
    assert package_version("no-such-distribution-safetyrepro") == ABSENT == "absent"


def test_atomic_writes_replace_the_file_and_leave_no_temp(tmp_path):
    p = tmp_path / "sub" / "a.json"
    atomic_write_json(p, {"b": 1, "a": [1, 2]}, indent=2)
    assert p.read_text() == json.dumps({"a": [1, 2], "b": 1}, indent=2) + "\n"
    atomic_write_text(p, "é")
    assert p.read_bytes() == "é".encode()
    atomic_write_bytes(p, memoryview(b"\x00\x01"))
    assert p.read_bytes() == b"\x00\x01"
    assert os.listdir(p.parent) == ["a.json"]


def test_modes_follow_the_umask_or_the_one_asked_for(tmp_path):
    old = os.umask(0o027)
    try:
        atomic_write_text(tmp_path / "a", "x")
        atomic_write_text(tmp_path / "b", "x", mode=0o600)
    finally:
        os.umask(old)
    assert os.stat(tmp_path / "a").st_mode & 0o777 == 0o640
    assert os.stat(tmp_path / "b").st_mode & 0o777 == 0o600


def test_a_link_at_the_target_is_replaced_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "pid").symlink_to(victim)
    atomic_write_json(tmp_path / "pid", {"pid": 1}, mode=0o600)
    assert victim.read_text() == "keep" and not (tmp_path / "pid").is_symlink()


def test_a_failing_writer_leaves_the_old_file_and_no_temp(tmp_path):
    p = tmp_path / "t.bin"
    p.write_bytes(b"old")

    def write(fh):
        fh.write(b"half")
        raise ValueError("checksum mismatch")

    with pytest.raises(ValueError, match="checksum mismatch"):
        atomic_write(p, write)
    assert p.read_bytes() == b"old" and os.listdir(tmp_path) == ["t.bin"]


def test_an_os_error_is_a_write_error_naming_the_file(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(WriteError) as err:
        atomic_write_text(tmp_path / "d", "x")
    assert str(err.value) == f"{tmp_path / 'd'}: cannot write: Is a directory"
    assert isinstance(err.value, OSError)


def test_sweep_removes_dead_writers_temps_only(tmp_path):
    target = tmp_path / "out.json"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    mine = tmp_path / f".out.json.{hostname()}.{os.getpid()}.a.tmp"
    gone = tmp_path / f".out.json.{hostname()}.{int(dead.stdout)}.b.tmp"
    other_new = tmp_path / ".out.json.othernode.12.c.tmp"
    other_old = tmp_path / ".out.json.othernode.13.d.tmp"
    for f in (mine, gone, other_new, other_old):
        f.write_bytes(b"partial")
    old = time.time() - STALE_TMP_S - 60
    os.utime(other_old, (old, old))
    assert sorted(sweep_stale_tmp(target)) == sorted([gone, other_old])
    assert mine.exists() and other_new.exists()
    atomic_write_text(target, "x")   # a write sweeps too, and keeps this process's own temp
    assert sorted(os.listdir(tmp_path)) == sorted(["out.json", mine.name, other_new.name])


def test_compile_bytecode_writes_what_python_then_loads_even_where_it_writes_none(tmp_path):
    """The workflow's start compiles the package, so its ~1,800 job processes import bytecode
    even under PYTHONDONTWRITEBYTECODE (where Python never writes it); a changed module is
    compiled again, and a broken one is reported, not raised."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text("VALUE = 1\n")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(tmp_path)}
    run = [sys.executable, "-c", "import pkg.mod, sys; print(pkg.mod.VALUE, pkg.mod.__cached__)"]
    subprocess.run(run, env=env, check=True, capture_output=True)
    assert not (pkg / "__pycache__").exists()      # Python itself wrote none
    assert compile_bytecode(pkg)
    cached = subprocess.run(run, env=env, check=True, capture_output=True, text=True).stdout.split()
    assert cached[0] == "1" and os.path.exists(cached[1])
    before = os.stat(cached[1]).st_mtime_ns
    (pkg / "mod.py").write_text("VALUE = 22\n")
    later = os.stat(pkg / "mod.py").st_mtime + 2     # bytecode records its source's mtime in s
    os.utime(pkg / "mod.py", (later, later))
    assert compile_bytecode(pkg) and os.stat(cached[1]).st_mtime_ns != before
    assert subprocess.run(run, env=env, check=True, capture_output=True, text=True).stdout.split()[0] == "22"
    (pkg / "broken.py").write_text("def (:\n")
    assert compile_bytecode(pkg) is False
