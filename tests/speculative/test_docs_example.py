"""The third-party proposer of docs/speculative-decoding.md runs as written: as a script on the embedded
model through the public facade, and through core's ProposerContract."""

from __future__ import annotations

import importlib.util
import re
import runpy
from pathlib import Path

import pytest

from hetero_core.testing import ProposerContract

DOC = Path(__file__).resolve().parents[2] / "docs" / "speculative-decoding.md"
MARKER = "<!-- example: phrase_proposer.py"


def example_source() -> str:
    text = DOC.read_text(encoding="utf-8")
    after = text[text.index(MARKER) :]
    return re.search(r"```python\n(.*?)```", after, re.S).group(1)


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    path = tmp_path_factory.mktemp("example") / "phrase_proposer.py"
    path.write_text(example_source(), encoding="utf-8")
    spec = importlib.util.spec_from_file_location("phrase_proposer", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return path, module


class TestDocsExampleContract(ProposerContract):
    vocab_size = 49152
    seeds = (0,)

    @pytest.fixture(autouse=True)
    def _example(self, example, smollm2_dir):
        self.module = example[1]
        self.model_dir = smollm2_dir

    def make_proposer(self, ctx):
        return self.module.PhraseProposer(ctx)


def test_the_example_proposes_the_rest_of_its_phrase(example, smollm2_dir):
    from hetero_core.speculative import ProposalInput, ProposerContext

    module = example[1]
    ctx = ProposerContext(
        options=None,
        num_speculative_tokens=4,
        vocab_size=49152,
        model_dir=smollm2_dir,
        executor="torch",
        block_size=16,
        max_model_len=2048,
        max_num_seqs=8,
    )
    proposer = module.PhraseProposer(ctx)
    phrase = proposer.phrases[0]
    assert proposer.propose([ProposalInput(0, [1, 2] + phrase[:3], 4)]) == [phrase[3:7]]
    assert proposer.propose([ProposalInput(0, [1, 2, 3], 4)]) == [[]]


@pytest.mark.slow
def test_the_example_runs_as_a_script(example, capsys, smollm2_dir):
    runpy.run_path(str(example[0]), run_name="__main__")
    out = capsys.readouterr().out
    assert re.search(r"proposed \d+, accepted \d+", out)
