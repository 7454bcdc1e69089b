"""The byte tokenizer: UTF-8 bytes as ids, BOS/EOS, a plain chat template."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hetero_core.default_plugins.byte_tokenizer import (
    BOS_TOKEN_ID,
    EOS_TOKEN_ID,
    ByteTokenizer,
    create_byte_tokenizer,
)
from hetero_core.errors import InvalidRequestError
from hetero_core.tokenizer import Tokenizer, TokenizerContext


def test_is_a_tokenizer_with_fixed_special_ids():
    tok = create_byte_tokenizer(TokenizerContext(options=None, model_dir=None))
    assert isinstance(tok, Tokenizer)
    assert (tok.eos_token_id, tok.bos_token_id, tok.vocab_size) == (257, 256, 258)


def test_encode_is_utf8_bytes_without_bos():
    assert ByteTokenizer().encode("hé") == [104, 0xC3, 0xA9]
    assert ByteTokenizer().encode("") == []


@pytest.mark.parametrize("text", ["你好，世界！", "emoji 🚀👍🏽", "code:\n\tx = 1\r\n", "\x00nul"])
def test_round_trips_examples(text):
    tok = ByteTokenizer()
    assert tok.decode(tok.encode(text)) == text


@given(st.text())
def test_round_trips_any_text(text):
    tok = ByteTokenizer()
    assert tok.decode(tok.encode(text)) == text


def test_decode_drops_bos_and_eos_and_replaces_invalid_bytes():
    tok = ByteTokenizer()
    assert tok.decode([BOS_TOKEN_ID, 104, 105, EOS_TOKEN_ID]) == "hi"
    assert tok.decode([0xE4, 0xBD]) == "\ufffd"  # an unfinished 3-byte character
    assert tok.decode([0xFF, 65]) == "\ufffdA"


@pytest.mark.parametrize("bad", [258, -1, 1000])
def test_decode_rejects_ids_outside_the_vocab(bad):
    with pytest.raises(InvalidRequestError, match=f"token id {bad} is out of range"):
        ByteTokenizer().decode([65, bad])


def test_chat_template_is_role_colon_content_then_assistant():
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "你好"}]
    ids = ByteTokenizer().encode_chat(messages)
    assert ByteTokenizer().decode(ids) == "system: Be brief.\nuser: 你好\nassistant: "


@pytest.mark.parametrize(
    "messages, error",
    [
        ([], "non-empty list"),
        ("hello", "non-empty list"),
        (["hello"], "message 0 must be an object"),
        ([{"content": "x"}], "message 0 needs a non-empty string 'role'"),
        ([{"role": "user", "content": "x"}, {"role": "user"}], "message 1 needs a string 'content'"),
    ],
)
def test_chat_rejects_malformed_messages(messages, error):
    with pytest.raises(InvalidRequestError, match=error):
        ByteTokenizer().encode_chat(messages)
