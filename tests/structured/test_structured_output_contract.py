"""Core's xgrammar backend passes the structured-output kit, on the byte tokenizer and on SmolLM2's."""

from __future__ import annotations

import pytest

from hetero_core.default_plugins.xgrammar_options import XGrammarOptions
from hetero_core.testing import StructuredOutputContract

pytest.importorskip("xgrammar", reason="structured output needs: pip install 'hetero-core[structured]'")


class TestXGrammarOnBytes(StructuredOutputContract):
    options = XGrammarOptions()

    def make_backend(self, ctx):
        from hetero_core.default_plugins.xgrammar_backend import XGrammarBackend

        return XGrammarBackend(ctx)


@pytest.mark.slow
class TestXGrammarOnSmolLM2(TestXGrammarOnBytes):
    seeds = (0,)

    @pytest.fixture(autouse=True)
    def _model(self, smollm2_dir):
        self.model_dir = smollm2_dir

    def make_tokenizer(self):
        from hetero_core.default_plugins.hf_tokenizer import HFTokenizer

        return HFTokenizer(self.model_dir)
