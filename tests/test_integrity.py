"""Written files are checked and failed writes are named: bit flips anywhere in a shard are
refused (never read back altered), a corrupt file is moved aside so a rerun recomputes it,
bad metadata JSON names the file, and a full disk, a read-only folder or a folder in the way
end in a WriteError naming the file with the earlier file intact (a real tmpfs for ENOSPC)."""

from __future__ import annotations

import errno
import json
import os
import random
import subprocess

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from safetyrepro.errors import ShardError, WriteError
from safetyrepro.io import CORRUPT_SUFFIX, DIGEST_KEY, META_KEY, read_metadata, read_parquet, write_csv, write_parquet
from safetyrepro.shards import read_shard
from safetyrepro.sysutil import atomic_write_text
from shard_synth import synthetic_run, write_cell


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    plan = synthetic_run(tmp_path_factory.mktemp("integrity"))
    return write_cell(plan, "m-nf4", "truthfulqa", "T1-t0.7-k3-freeform", 1, n_correct=2)


def test_shards_carry_page_checksums_and_a_digest(shard):
    md = pq.read_schema(shard).metadata
    assert len(md[DIGEST_KEY]) == 64 and META_KEY in md
    # page checksums: a flipped bit inside a data page fails the read even with digests off
    col = pq.ParquetFile(shard).metadata.row_group(0).column(3)   # raw_output
    start = col.dictionary_page_offset or col.data_page_offset
    data = bytearray(shard.read_bytes())
    data[start + col.total_compressed_size - 2] ^= 0x10
    bad = shard.with_name("page.parquet")
    bad.write_bytes(bytes(data))
    with pytest.raises(OSError, match="(?i)checksum|crc"):
        pq.read_table(bad, page_checksum_verification=True)


def test_bit_flips_anywhere_are_refused_or_harmless(shard, tmp_path):
    """300 single-bit flips at random positions of a real shard: each one is refused with a
    ShardError naming the file, or reads back identical (padding, unused statistics);
    none reads back altered."""
    good_table, good_meta = read_shard(shard)
    data = shard.read_bytes()
    rng = random.Random(2028)
    refused = same = 0
    for k in range(300):
        b = bytearray(data)
        b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        p = tmp_path / f"flip{k}.parquet"
        p.write_bytes(bytes(b))
        try:
            table, meta = read_shard(p)
        except ShardError as exc:
            assert str(exc).startswith(f"{p}: ")
            refused += 1
            continue
        assert table.equals(good_table) and meta == good_meta, f"flip {k} read back altered"
        same += 1
    assert refused + same == 300 and refused > 150


def test_a_corrupt_file_is_moved_aside_and_named(shard, tmp_path):
    p = tmp_path / "s.parquet"
    data = bytearray(shard.read_bytes())
    col = pq.ParquetFile(shard).metadata.row_group(0).column(0)
    data[(col.dictionary_page_offset or col.data_page_offset) + col.total_compressed_size - 1] ^= 0x01
    p.write_bytes(bytes(data))
    with pytest.raises(ShardError) as err:
        read_shard(p)
    assert str(err.value).startswith(f"{p}: ") and f"moved to s.parquet{CORRUPT_SUFFIX}" in str(err.value)
    assert not p.exists() and (tmp_path / f"s.parquet{CORRUPT_SUFFIX}").read_bytes() == bytes(data)


def test_altered_values_with_valid_pages_fail_the_digest(shard, tmp_path):
    """A file rewritten with other values but the old digest (what a bit flip inside a page
    without checksums would give) is refused by the digest alone."""
    table, meta = read_parquet(shard)
    forged = tmp_path / "forged.parquet"
    flipped = table.set_column(6, "correct", pa.array([not v for v in table.column("correct").to_pylist()]))
    md = pq.read_schema(shard).metadata
    pq.write_table(flipped.replace_schema_metadata(md), forged)
    with pytest.raises(ShardError, match="content digest does not match"):
        read_parquet(forged)


@pytest.mark.parametrize("raw, needle", [(b"{not json", "not valid JSON"), (b"[1, 2]", "a list, not a JSON object")])
def test_bad_metadata_json_is_named(tmp_path, raw, needle):
    p = tmp_path / "m.parquet"
    pq.write_table(pa.table({"x": [1]}).replace_schema_metadata({META_KEY: raw}), p)
    with pytest.raises(ShardError) as err:
        read_metadata(p)
    assert str(err.value).startswith(f"{p}: ") and needle in str(err.value)
    p2 = tmp_path / "m2.parquet"
    pq.write_table(pa.table({"x": [1]}).replace_schema_metadata({META_KEY: raw}), p2)
    with pytest.raises(ShardError, match=needle):
        read_shard(p2)


def test_tables_without_a_digest_still_read(tmp_path):
    """Files written before digests existed are read as before (no digest key, no checks)."""
    p = tmp_path / "old.parquet"
    pq.write_table(pa.table({"x": [1, 2]}).replace_schema_metadata({META_KEY: json.dumps({"k": 1}).encode()}), p)
    table, meta = read_parquet(p)
    assert meta == {"k": 1} and table.column("x").to_pylist() == [1, 2]


# ---- failed writes --------------------------------------------------------------------------

@pytest.fixture
def tiny_disk(tmp_path):
    """A 64 KiB tmpfs (root only), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    d = tmp_path / "disk"
    d.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(d)], check=True)
    try:
        yield d
    finally:
        subprocess.run(["umount", str(d)], check=True)


def test_disk_full_keeps_the_earlier_file_and_no_temp(tiny_disk):
    good = tiny_disk / "t.parquet"
    write_parquet(pa.table({"x": [1, 2, 3]}), good, {"k": "good"})
    before = good.read_bytes()
    big = pa.table({"x": [os.urandom(256).hex() for _ in range(400)]})   # ~200 KB of random text
    with pytest.raises(WriteError) as err:
        write_parquet(big, good, {"k": "big"})
    assert str(err.value) == f"{good}: cannot write: No space left on device"
    assert isinstance(err.value, OSError) and err.value.errno == errno.ENOSPC   # `except OSError` still holds
    assert good.read_bytes() == before and sorted(x.name for x in tiny_disk.iterdir()) == ["t.parquet"]
    with pytest.raises(WriteError, match="No space left on device"):
        atomic_write_text(tiny_disk / "a.txt", "x" * 200_000)
    assert sorted(x.name for x in tiny_disk.iterdir()) == ["t.parquet"]


def test_import_with_a_full_disk_keeps_the_earlier_table(tiny_disk):
    """The probe: `import ... --out x.parquet` on a full disk deleted an earlier good file.
    The import command's writer (crosspkg.cli._write) on an import result of 2,000 rows."""
    import pandas as pd

    from safetyrepro.crosspkg.cli import _write
    from safetyrepro.crosspkg.importers import ImportResult, Run

    out = tiny_disk / "x.parquet"
    write_parquet(pa.table({"x": [1]}), out, {"k": "earlier"})
    before = out.read_bytes()
    table = pd.DataFrame({"model": [os.urandom(16).hex() for _ in range(2000)], "benchmark": "xstest",
                          "config": "c", "item": [str(i) for i in range(2000)], "score": 1.0})
    run = Run(source="r.json", model="m", benchmark="xstest", settings={"task": "xstest"}, scores={}, metric="acc")
    with pytest.raises(WriteError, match="No space left on device"):
        _write(ImportResult(table=table, axes=[], runs=[run]), out)
    assert out.read_bytes() == before and [x.name for x in tiny_disk.iterdir()] == ["x.parquet"]


def test_a_folder_in_the_way_is_named(tmp_path):
    (tmp_path / "t.csv").mkdir()
    with pytest.raises(WriteError) as err:
        atomic_write_text(tmp_path / "t.csv", "a")
    assert str(err.value) == f"{tmp_path / 't.csv'}: cannot write: Is a directory"
    assert [x.name for x in tmp_path.iterdir()] == ["t.csv"]
    (tmp_path / "f").write_text("")
    with pytest.raises(WriteError) as err:
        write_csv(pd.DataFrame({"a": [1]}), tmp_path / "f" / "t.csv")
    assert str(err.value).startswith(f"{tmp_path / 'f' / 't.csv'}: cannot write: ")


def _in_child_as_nobody(fn, *args) -> str:
    """``fn(*args)`` (returning a string) in a forked child, which first drops to uid/gid 65534
    when this process is root; the child's result, or its exception as "Type message". A fork,
    not a new interpreter: the child needs no read access to this checkout or its venv (a
    checkout in a folder only root may enter, e.g. under mkdtemp or /root, stays testable)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(r)
            if os.geteuid() == 0:
                os.setgroups([])
                os.setresgid(65534, 65534, 65534)
                os.setresuid(65534, 65534, 65534)
            out = fn(*args)
        except BaseException as e:  # noqa: BLE001 - reported to the parent as text
            out = f"{type(e).__name__} {e}"
        os.write(w, out.encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        out = fh.read().decode()
    assert os.waitpid(pid, 0)[1] == 0
    return out


def _write(path) -> str:
    atomic_write_text(path, "x")
    return "written"


def _read(path) -> str:
    read_parquet(path)
    return "read"


def test_permission_denied_is_named(tmp_path):
    """As another uid (root runs it as nobody, in a child): a folder it may not write."""
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o555)
    os.chmod(tmp_path, 0o755)
    out = _in_child_as_nobody(_write, ro / "t.csv")
    assert out == f"WriteError {ro / 't.csv'}: cannot write: Permission denied"


def test_a_file_it_may_not_read_is_named_and_left_alone(tmp_path):
    """Permission denied is the system's fault, not the file's: it is not moved aside."""
    d = tmp_path / "open"
    d.mkdir()
    p = d / "t.parquet"
    write_parquet(pa.table({"x": [1]}), p, {"k": 1})
    # root's child runs as nobody (a 0600 file of root's); any other user's child as that user
    os.chmod(p, 0o600 if os.geteuid() == 0 else 0o000)
    os.chmod(d, 0o777)
    os.chmod(tmp_path, 0o755)
    out = _in_child_as_nobody(_read, p)
    assert out.startswith(f"ShardError {p}: cannot read: ") and "Permission denied" in out, out
    assert p.exists() and not p.with_name(p.name + CORRUPT_SUFFIX).exists()
