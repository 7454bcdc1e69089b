"""Settings: precedence (CLI > env > file > defaults), file formats, per-plugin sections, errors."""

import re
import warnings
from pathlib import Path

import pytest
import tomllib

from hetero_core.builder import check_sections
from hetero_core.errors import ConfigError
from hetero_core.plugin_system.discovery import load_plugins
from hetero_core.settings import HeteroSettings, SettingsWarning, load_settings

README = Path(__file__).parent.parent / "README.md"


def test_defaults_match_hetero_paged_infer():
    s = load_settings()
    assert (s.block_size, s.max_num_blocks, s.max_batch_size, s.max_num_seqs) == (16, 1024, 32, 256)
    assert (s.max_model_len, s.max_total_tokens, s.memory_threshold) == (2048, 4096, 0.9)
    assert (s.executor.name, s.tokenizer.name, s.scheduler_policy.name, s.kv_allocator.name) == (
        "torch",
        "auto",
        "fcfs",
        "paged",
    )


def test_run_defaults_answer_rather_than_ramble():
    s = load_settings()
    assert (s.temperature, s.max_tokens, s.chat, s.log_level) == (0.0, 128, None, "warning")


def test_the_readme_settings_example_shows_the_real_defaults():
    text = README.read_text(encoding="utf-8")
    block = re.search(r"```toml\n# hetero.toml: the defaults\n(.*?)```", text, re.S)
    assert block, "README's settings example (a toml block starting '# hetero.toml: the defaults') is missing"
    shown = tomllib.loads(block.group(1))
    defaults = load_settings()
    assert len(shown) >= 10
    for name, value in shown.items():
        actual = getattr(defaults, name)
        assert (actual.name if hasattr(actual, "name") else actual) == value, name


def test_unknown_hetero_variables_warn_with_the_closest_setting(monkeypatch):
    monkeypatch.setenv("HETERO_BLOK_SIZE", "8")
    monkeypatch.setenv("HETERO_ZZZZZZZZ", "1")
    monkeypatch.setenv("HETERO_EXECUTOR__MOCK__EOS_AFTER", "3")  # nested values are known
    monkeypatch.setenv("HETERO_DISABLE_PLUGIN_AUTOLOAD", "")  # a switch, not a setting
    monkeypatch.setenv("HETERO_block_size", "4")  # names are case-insensitive
    with pytest.warns(SettingsWarning) as caught:
        s = load_settings()
    messages = sorted(str(w.message) for w in caught)
    assert messages == [
        "unknown environment variable HETERO_BLOK_SIZE, ignored; did you mean HETERO_BLOCK_SIZE?",
        "unknown environment variable HETERO_ZZZZZZZZ, ignored",
    ]
    assert s.block_size == 4


def test_known_variables_do_not_warn(monkeypatch):
    for name in HeteroSettings.model_fields:
        monkeypatch.setenv(f"HETERO_{name.upper()}", "")
        monkeypatch.delenv(f"HETERO_{name.upper()}")
    monkeypatch.setenv("HETERO_BLOCK_SIZE", "8")
    with warnings.catch_warnings():
        warnings.simplefilter("error", SettingsWarning)
        assert load_settings().block_size == 8


def test_unknown_keywords_name_the_closest_setting():
    with pytest.raises(ConfigError, match="unknown setting 'max_tokns'; did you mean 'max_tokens'?"):
        load_settings(max_tokns=3)
    with pytest.raises(ConfigError, match="^unknown setting 'qqqq'$"):
        load_settings(qqqq=3)


def test_plugin_option_typos_name_the_closest_option(tmp_path):
    plugins = load_plugins()
    typo = load_settings(executor={"name": "mock", "mock": {"eos_afer": 3}})
    with pytest.raises(ConfigError, match="eos_afer: unknown setting; did you mean 'eos_after'?"):
        check_sections(typo, plugins.registry)


def test_precedence_cli_over_env_over_file(tmp_path, monkeypatch):
    config = tmp_path / "hetero.toml"
    config.write_text("block_size = 32\nmax_num_blocks = 64\nmax_batch_size = 3\n")
    assert load_settings(config).block_size == 32
    monkeypatch.setenv("HETERO_BLOCK_SIZE", "8")
    monkeypatch.setenv("HETERO_MAX_NUM_BLOCKS", "128")
    s = load_settings(config, block_size=4)
    assert (s.block_size, s.max_num_blocks, s.max_batch_size) == (4, 128, 3)


def test_flat_json_file(tmp_path):
    config = tmp_path / "hetero.json"
    config.write_text('{"block_size": 16, "max_num_blocks": 1024, "executor": "mock"}')
    s = load_settings(config)
    assert (s.max_num_blocks, s.executor.name) == (1024, "mock")


def test_component_table_with_plugin_sections_merges_with_a_name_from_env(tmp_path, monkeypatch):
    config = tmp_path / "hetero.toml"
    config.write_text('[executor]\nname = "torch"\n[executor.mock]\neos_after = 3\n')
    monkeypatch.setenv("HETERO_EXECUTOR", "mock")
    s = load_settings(config)
    assert s.executor.name == "mock" and s.executor.section("mock") == {"eos_after": 3}


def test_plugin_section_from_env_nested_variables(monkeypatch, tmp_path):
    monkeypatch.setenv("HETERO_EXECUTOR__MOCK__EOS_AFTER", "4")
    assert load_settings().executor.section("mock") == {"eos_after": "4"}
    monkeypatch.setenv("HETERO_EXECUTOR", "mock")  # a name and a section, both from the environment
    config = tmp_path / "hetero.toml"
    config.write_text('[executor]\nname = "torch"\n[executor.mock]\neos_after = 20\nseed = 3\n')
    s = load_settings(config)
    assert s.executor.name == "mock" and s.executor.section("mock") == {"eos_after": "4", "seed": 3}


def test_plugin_sections_are_validated_by_the_plugin_model(tmp_path):
    plugins = load_plugins()
    good = load_settings(executor={"name": "mock", "mock": {"eos_after": 3}})
    check_sections(good, plugins.registry)
    bad = load_settings(executor={"name": "mock", "mock": {"eos_after": 0, "colour": "red"}})
    with pytest.raises(ConfigError) as err:
        check_sections(bad, plugins.registry)
    assert (
        "executor.mock" in str(err.value)
        and "eos_after" in str(err.value)
        and "colour: unknown setting" in str(err.value)
    )
    typo = load_settings(executor={"name": "mock", "mokc": {}})
    with pytest.raises(
        ConfigError, match=r"\[executor.mokc\]: unknown executor 'mokc'; available: cuda, mock"
    ):
        check_sections(typo, plugins.registry)


@pytest.mark.parametrize(
    "content, message",
    [
        ("block_size = -1", "block_size: Input should be greater than or equal to 1"),
        ("memory_threshold = 1.5", "memory_threshold: Input should be less than or equal to 1"),
        ("colour = 'red'", "colour: unknown setting"),
        ("block_size = [", "is not valid TOML"),
        ("temperature = -1", "temperature"),
    ],
)
def test_invalid_files_give_one_readable_error(tmp_path, content, message):
    config = tmp_path / "bad.toml"
    config.write_text(content)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        load_settings(config)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="settings file not found"):
        load_settings(tmp_path / "nope.toml")


def test_plugins_allow_list_from_env(monkeypatch):
    monkeypatch.setenv("HETERO_PLUGINS", "mock, cuda")
    assert load_settings().plugins == ["mock", "cuda"]


def test_bad_env_value(monkeypatch):
    monkeypatch.setenv("HETERO_MAX_BATCH_SIZE", "many")
    with pytest.raises(ConfigError, match="max_batch_size"):
        load_settings()
