"""Checked cache files (``model/cache_file``): a checksum footer that catches truncated, zeroed,
overwritten, footer-less and misplaced files, a manifest for folders, and atomic writes that a
concurrent reader never sees half-done."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from hetero_core.cache import cache_file
from hetero_core.cache.cache_file import CacheFileInvalid
from tests.model.damaged_files import DAMAGE, damage

PAYLOAD = os.urandom(3 * cache_file.CHUNK_WORDS * 8 + 13)  # three whole chunks, a partial one, a ragged tail


def write(tmp_path, name="data.bin", payload=PAYLOAD):
    path = tmp_path / name
    cache_file.write_checked(path, payload)
    return path


def test_a_written_file_reads_back_as_its_payload(tmp_path):
    path = write(tmp_path)
    assert cache_file.read_checked(path) == PAYLOAD
    assert bytes(cache_file.map_checked(path).numpy()) == PAYLOAD
    assert path.stat().st_size == len(PAYLOAD) + cache_file.FOOTER_BYTES
    assert cache_file.read_checked(write(tmp_path, "empty.json", b"")) == b""
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left


@pytest.mark.parametrize("how", DAMAGE)
def test_damage_is_found_and_named(tmp_path, how):
    path = write(tmp_path)
    damage(path, how)
    with pytest.raises(CacheFileInvalid) as error:
        cache_file.map_checked(path)
    assert error.value.path == path and error.value.problem


def test_a_file_copied_under_another_key_is_invalid(tmp_path):
    path = write(tmp_path, "model-aaaa.bin")
    other = tmp_path / "model-bbbb.bin"
    other.write_bytes(path.read_bytes())
    with pytest.raises(CacheFileInvalid, match="checksum"):
        cache_file.map_checked(other)


def test_a_file_without_a_footer_is_invalid_and_a_missing_one_is_absent(tmp_path):
    (tmp_path / "old.json").write_text('{"written": "by an older version"}')
    with pytest.raises(CacheFileInvalid, match="no checksum footer"):
        cache_file.read_checked(tmp_path / "old.json")
    with pytest.raises(FileNotFoundError):
        cache_file.read_checked(tmp_path / "never-written.json")


def test_the_manifest_lists_sizes_and_checksums(tmp_path):
    folder = tmp_path / "converted"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(PAYLOAD)
    cache_file.write_manifest(folder, source="x.gguf")
    manifest = cache_file.read_manifest(folder)
    assert manifest["source"] == "x.gguf" and set(manifest["files"]) == {"config.json", "model.safetensors"}
    cache_file.check_listed(folder, manifest, manifest["files"])
    damage(folder / "model.safetensors", "zeroed block")
    cache_file.check_listed(folder, manifest, manifest["files"], checksummed=["config.json"])  # sizes only
    with pytest.raises(CacheFileInvalid, match="checksum"):
        cache_file.check_listed(folder, manifest, manifest["files"])
    damage(folder / "model.safetensors", "truncated")
    with pytest.raises(CacheFileInvalid, match="bytes where the manifest lists"):
        cache_file.check_listed(folder, manifest, manifest["files"], checksummed=[])
    (folder / cache_file.MANIFEST).unlink()
    with pytest.raises(CacheFileInvalid, match="no hetero-manifest.json"):
        cache_file.read_manifest(folder)


WRITER = """
import sys, time
from pathlib import Path
from hetero_core.cache import cache_file
target, stop, seed = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
deadline, i = time.monotonic() + 120, 0
while not stop.exists() and time.monotonic() < deadline:
    cache_file.write_checked(target, bytes([seed]) * ((1 << 20) * (1 + i % 3)))
    i += 1
"""


def test_a_reader_never_sees_a_half_written_file_while_two_processes_write(tmp_path):
    target, stop = tmp_path / "shared.bin", tmp_path / "stop"
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(target), str(stop), str(seed)]) for seed in (1, 2)
    ]
    reads, deadline = 0, time.monotonic() + 120
    try:
        while reads < 100 and time.monotonic() < deadline:
            try:
                payload = cache_file.read_checked(target)  # CacheFileInvalid here fails the test
            except FileNotFoundError:
                continue
            assert len(set(payload)) == 1 and len(payload) % (1 << 20) == 0  # one writer's whole payload
            reads += 1
    finally:
        stop.touch()
    assert [w.wait(timeout=60) for w in writers] == [0, 0]
    assert reads == 100
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shared.bin", "stop"]  # no temporaries left


def test_the_parallel_and_the_single_threaded_sums_agree(tmp_path, monkeypatch):
    """Model-sized files are summed by torch on every core, small ones by numpy: one checksum."""
    data = cache_file.map_file(write(tmp_path))
    small = cache_file.checksum(data, "x")
    monkeypatch.setattr(cache_file, "PARALLEL_BYTES", 0)
    assert cache_file.checksum(data, "x") == small
    assert cache_file.checksum(data, "y") != small
