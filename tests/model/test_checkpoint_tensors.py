"""The lazy checkpoint mapping (each tensor read alone, on access) and the prepared file written a
tensor at a time: what streamed loading stands on."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from safetensors.torch import load_file, save_file  # noqa: E402

from hetero_core.cache import cache_file  # noqa: E402
from hetero_core.errors import ModelLoadError  # noqa: E402
from hetero_core.model.checkpoint_tensors import SafetensorsTensors  # noqa: E402
from hetero_core.model.cpu.prepared_file import _safetensors_views  # noqa: E402
from hetero_core.model.cpu.prepared_writer import ALIGNMENT, PreparedFileWriter, header_room  # noqa: E402

TENSORS = {
    "a.weight": torch.randn(5, 3).to(torch.bfloat16),
    "b.weight": torch.randn(7),
    "codes": torch.arange(3, dtype=torch.uint8),
    "ids": torch.tensor([1, -2], dtype=torch.int64),
    "empty": torch.zeros(0, 4),
}


@pytest.fixture
def shards(tmp_path):
    first, second = tmp_path / "one.safetensors", tmp_path / "two.safetensors"
    save_file({k: TENSORS[k] for k in ("a.weight", "b.weight")}, first)
    save_file({k: TENSORS[k] for k in ("codes", "ids", "empty")}, second)
    return [first, second]


def test_every_tensor_reads_back_as_saved_and_each_read_is_a_fresh_tensor(shards):
    tensors = SafetensorsTensors(shards)
    assert sorted(tensors) == sorted(TENSORS) and len(tensors) == len(TENSORS)
    assert tensors.shape("a.weight") == (5, 3) and tensors.num_elements() == 15 + 7 + 3 + 2
    for name, expected in TENSORS.items():
        assert tensors[name].dtype == expected.dtype and torch.equal(tensors[name], expected), name
    assert tensors["a.weight"].data_ptr() != tensors["a.weight"].data_ptr()  # nothing kept between reads
    with pytest.raises(KeyError):
        tensors["missing"]


@pytest.mark.parametrize("damage", ["truncated", "garbage header", "too short"])
def test_a_damaged_shard_is_refused_naming_the_file(shards, damage):
    path = shards[0]
    data = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(data[:-10])
    elif damage == "garbage header":
        path.write_bytes(len(b"{not json").to_bytes(8, "little") + b"{not json" + data[8:])
    else:
        path.write_bytes(b"abc")
    with pytest.raises(ModelLoadError, match="one.safetensors"):
        SafetensorsTensors(shards)


def test_the_prepared_file_written_a_tensor_at_a_time_is_safetensors_with_aligned_tensors(tmp_path):
    path = tmp_path / "prepared.safetensors"
    metadata = {"format": "3"}
    with open(path, "wb") as file:
        writer = PreparedFileWriter(file, header_room(list(TENSORS), metadata))
        for name, tensor in TENSORS.items():
            writer.add(name, tensor)
        writer.finish(metadata)
    loaded = load_file(path)  # the safetensors library itself accepts it (no holes, header padded)
    assert all(torch.equal(loaded[name], tensor) for name, tensor in TENSORS.items())
    payload = cache_file.map_file(path)  # mapped as loading maps it (page-aligned)
    read_metadata, views = _safetensors_views(payload)
    assert read_metadata == metadata and sorted(views) == sorted(TENSORS)  # no padding entries
    for name, tensor in TENSORS.items():
        assert torch.equal(views[name], tensor)
        assert (views[name].data_ptr() - payload.data_ptr()) % ALIGNMENT == 0, name
    header = json.loads(path.read_bytes()[8 : 8 + int.from_bytes(path.read_bytes()[:8], "little")])
    assert any(name.startswith("__padding__.") for name in header)  # the gaps are listed, not holes


def test_a_header_that_outgrows_its_room_is_an_error_not_a_damaged_file(tmp_path):
    with open(tmp_path / "p.safetensors", "wb") as file:
        writer = PreparedFileWriter(file, ALIGNMENT - 8)
        writer.add("a.weight", TENSORS["a.weight"])
        with pytest.raises(ValueError, match="header takes"):
            writer.finish({"format": "3"})
