"""``GGUFFile``, the one-pass GGUF header reader ``open_gguf`` uses, against ``gguf.GGUFReader``; and the
GGUF tokenizer converted through the class ``AutoTokenizer`` settles on, called directly."""

from __future__ import annotations

import filecmp

import numpy as np
import pytest

from hetero_core.errors import ModelLoadError
from hetero_core.model import gguf_export
from hetero_core.model.gguf_checkpoint import open_gguf
from hetero_core.model.gguf_file import GGUFFile
from tests.model.test_gguf_fixtures import DATA

gguf = pytest.importorskip("gguf")
FIXTURES = sorted(DATA.glob("tiny-*.gguf"))


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_fields_and_tensors_are_gguf_readers(path):
    fast, reference = GGUFFile(path), gguf.GGUFReader(str(path))
    fields = {key: field for key, field in reference.fields.items() if not key.startswith("GGUF.")}
    assert list(fast.fields) == list(fields)
    for key, field in fields.items():
        assert fast.fields[key].contents() == field.contents(), key
    assert [t.name for t in fast.tensors] == [t.name for t in reference.tensors]
    for mine, theirs in zip(fast.tensors, reference.tensors, strict=True):
        assert mine.tensor_type == theirs.tensor_type
        assert (mine.n_elements, mine.n_bytes, mine.data_offset) == (
            theirs.n_elements,
            theirs.n_bytes,
            theirs.data_offset,
        )
        assert np.array_equal(mine.shape, theirs.shape)
        assert mine.data.dtype == theirs.data.dtype and mine.data.shape == theirs.data.shape
        assert mine.data.tobytes() == theirs.data.tobytes()
        assert not mine.data.flags.writeable  # a view of the read-only mapping, as GGUFReader's


def test_a_damaged_header_is_one_clear_error(tmp_path):
    whole = FIXTURES[0].read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[:2000])  # inside the tokenizer's strings
    with pytest.raises(ModelLoadError, match="cannot read GGUF file .*cut.gguf"):
        open_gguf(cut)
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGML" + whole[4:])
    with pytest.raises(ModelLoadError, match="no GGUF magic"):
        open_gguf(other)


def test_gguf_tokenizer_as_auto(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    path = FIXTURES[0]
    direct, auto = tmp_path / "direct", tmp_path / "auto"
    direct.mkdir(), auto.mkdir()
    import transformers
    from transformers import AutoTokenizer

    if hasattr(transformers, "TokenizersBackend"):  # transformers 5: the direct path, not AutoTokenizer
        assert gguf_export.gguf_tokenizer_class("llama") is transformers.TokenizersBackend
    assert gguf_export.gguf_tokenizer_class("qwen2") is AutoTokenizer
    gguf_export.export_tokenizer(path, direct, max_length=128, model_type="llama")

    monkeypatch.setattr(gguf_export, "gguf_tokenizer_class", lambda model_type: AutoTokenizer)
    gguf_export.export_tokenizer(path, auto, max_length=128, model_type="llama")
    names = sorted(p.name for p in auto.iterdir())
    assert names == sorted(p.name for p in direct.iterdir()) and "tokenizer.json" in names
    match, mismatch, errors = filecmp.cmpfiles(auto, direct, names, shallow=False)
    assert (mismatch, errors) == ([], [])
