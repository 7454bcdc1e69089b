"""Speculative decoding through the front doors: LLM (settings and vLLM's speculative_config), hetero run
(flags and its summary line), the settings' environment variables and engine.stats()."""

from __future__ import annotations

import pytest

from hetero_core import LLM, SamplingParams
from hetero_core.errors import ConfigError
from hetero_core.settings import load_settings
from hetero_core.speculative_config import speculative_settings
from tests.cli_helpers import hetero

REPEATS = "abc abc abc abc abc abc abc"


def test_speculative_config_maps_to_settings():
    assert speculative_settings({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}) == {
        "num_speculative_tokens": 3,
        "speculative_proposer": {"name": "ngram", "ngram": {"prompt_lookup_max": 4}},
    }
    assert speculative_settings({"model": "draft-dir", "num_speculative_tokens": 2})[
        "speculative_proposer"
    ] == {"name": "draft", "draft": {"model": "draft-dir"}}
    draft_model = speculative_settings({"method": "draft_model", "num_speculative_tokens": 2})
    assert draft_model["speculative_proposer"]["name"] == "draft"
    with pytest.raises(ConfigError, match="needs num_speculative_tokens"):
        speculative_settings({"method": "ngram"})


def test_llm_takes_settings_or_speculative_config_and_outputs_stay_the_same():
    params = SamplingParams(temperature=0, max_tokens=16)
    expected = LLM(executor="mock").generate([REPEATS], params)[0].output_token_ids
    # the mock's tokens are random: 1-grams are what recurs (the default looks for 2 or more)
    by_settings = LLM(
        executor="mock",
        num_speculative_tokens=3,
        speculative_proposer={"name": "ngram", "ngram": {"prompt_lookup_min": 1, "prompt_lookup_max": 4}},
    )
    by_config = LLM(
        executor="mock",
        speculative_config={
            "method": "ngram",
            "num_speculative_tokens": 2,
            "prompt_lookup_max": 3,
            "prompt_lookup_min": 1,
        },
    )
    for llm in (by_settings, by_config):
        assert llm.generate([REPEATS], params)[0].output_token_ids == expected
        assert llm.engine.stats().spec_num_draft_tokens > 0
    assert by_config.engine.speculation.num_speculative_tokens == 2
    with pytest.raises(ConfigError, match=r"speculative_proposer\.ngram.*disable_by_batch_size"):
        LLM(
            executor="mock",
            speculative_config={"method": "ngram", "num_speculative_tokens": 2, "disable_by_batch_size": 4},
        )


def test_environment_variables_reach_the_settings(monkeypatch):
    monkeypatch.setenv("HETERO_NUM_SPECULATIVE_TOKENS", "4")
    monkeypatch.setenv("HETERO_SPECULATIVE_PROPOSER__NGRAM__PROMPT_LOOKUP_MAX", "6")
    settings = load_settings()
    assert settings.num_speculative_tokens == 4
    assert settings.speculative_proposer.name == "ngram"
    assert settings.speculative_proposer.section("ngram") == {"prompt_lookup_max": "6"}


def test_stats_without_speculation_are_zero_and_rates_none():
    stats = LLM(executor="mock").engine.stats()
    assert (stats.spec_num_drafts, stats.spec_num_draft_tokens, stats.spec_num_accepted_tokens) == (0, 0, 0)
    assert stats.spec_acceptance_rate is None and stats.spec_mean_accepted_length is None


def test_hetero_run_prints_the_speculation_summary_and_the_same_text():
    plain = hetero("run", "--executor", "mock", "--max-tokens", "24", REPEATS)
    result = hetero(
        "run",
        "--executor",
        "mock",
        "--max-tokens",
        "24",
        "--num-speculative-tokens",
        "3",
        "--speculative-proposer",
        "ngram",
        REPEATS,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == plain.stdout
    line = next(line for line in result.stderr.splitlines() if line.startswith("--- speculative decoding"))
    assert "proposed" in line and "accepted" in line and "mean accepted length" in line
    assert "speculative decoding" not in plain.stderr


def test_batch_files_run_with_speculation_and_print_its_summary(tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text(
        '{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": '
        '{"model": "m", "prompt": "abc abc abc abc abc", "max_tokens": 16, "temperature": 0}}\n'
    )
    texts = []
    for flags in ((), ("--num-speculative-tokens", "3")):
        result = hetero("run", "--executor", "mock", *flags, "--input-file", str(source), "--output", "-")
        assert result.returncode == 0, result.stderr
        texts.append(result.stdout.split('"text": ')[1].split('"')[1])
        assert ("--- speculative decoding" in result.stderr) == bool(flags)
    assert texts[0] == texts[1]
