"""The builder: model limits read from config.json, allow-list and unknown-executor messages."""

import json
import types

import pytest

import hetero_plugins_mock
from hetero_core.builder import build_engine
from hetero_core.errors import ConfigError, PluginError, UnknownComponentError
from hetero_core.plugin_system.discovery import load_plugins
from hetero_core.plugin_system.hookspecs import hookimpl
from hetero_core.settings import load_settings
from hetero_plugins_mock.executor import MockExecutor


def model_executor_plugin(contexts):
    """A plugin whose executor 'needs a model' (so the builder resolves one) and runs the mock."""

    @hookimpl
    def register_executors(register):
        register("needs-model", lambda ctx: contexts.append(ctx) or MockExecutor(ctx), needs_model=True)

    return types.SimpleNamespace(register_executors=register_executors)


@pytest.fixture
def model_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 64}))  # no weights read
    return tmp_path


def build(contexts, model_dir, **settings):
    plugins = load_plugins(entry_points=[], extra_plugins=[("needs-model", model_executor_plugin(contexts))])
    return build_engine(
        load_settings(model=str(model_dir), executor="needs-model", tokenizer="byte", **settings), plugins
    )


def test_max_model_len_beyond_the_model_limit_is_refused_with_both_numbers(model_dir):
    with pytest.raises(
        ConfigError, match="max_model_len 100 exceeds the model's position limit of 64"
    ) as err:
        build([], model_dir, max_model_len=100)
    assert "max_position_embeddings" in str(err.value) and "--max-model-len 64" in str(err.value)


def test_max_model_len_within_the_limit_is_kept_and_the_default_is_lowered_to_it(model_dir):
    contexts = []
    assert build(contexts, model_dir, max_model_len=32).max_model_len == 32
    engine = build(contexts, model_dir)  # the default (2048) is more than this model can do
    assert engine.max_model_len == 64 and contexts[-1].max_model_len == 64


def test_a_model_without_a_position_limit_is_not_checked(model_dir):
    (model_dir / "config.json").write_text("{}")
    assert build([], model_dir, max_model_len=5000).max_model_len == 5000


def test_an_unreadable_config_is_one_clear_error(model_dir):
    (model_dir / "config.json").write_text("{not json")
    with pytest.raises(Exception, match="cannot read .*config.json"):
        build([], model_dir)


def test_the_allow_list_must_name_installed_plugins():
    plugins = load_plugins(allow=["mock", "nonexistent"])
    with pytest.raises(
        PluginError,
        match="names 'nonexistent', which is not installed; installed plugins: "
        "bench, cuda, fair-share, mock, phi3, triton",
    ):
        build_engine(load_settings(executor="mock", plugins=["mock", "nonexistent"]), plugins)
    engine = build_engine(load_settings(executor="mock", plugins=["core", "mock"]))  # core always loads
    assert engine.generate(["hi"])[0].finished


def test_an_unknown_executor_says_which_plugins_the_allow_list_disabled():
    settings = load_settings(executor="triton", plugins=["mock"])
    with pytest.raises(UnknownComponentError) as err:
        build_engine(settings)
    assert str(err.value) == (
        "unknown executor 'triton'; available: mock, null, torch; plugin 'triton' is installed but "
        "disabled by the plugins allow-list (HETERO_PLUGINS / --plugins); add it to the list"
    )
    plugins = load_plugins(entry_points=[], extra_plugins=[("mock", hetero_plugins_mock)])
    with pytest.raises(
        UnknownComponentError,
        match="^unknown executor 'mokc'; available: mock, null, torch; did you mean 'mock'\\?$",
    ):
        build_engine(load_settings(executor="mokc"), plugins)


def test_the_dtype_setting_sets_the_executors_dtype_option():
    from hetero_core.builder import select
    from hetero_core.errors import ConfigError
    from hetero_core.plugin_system.discovery import load_plugins
    from hetero_core.settings import load_settings

    plugins = load_plugins(entry_points=[])
    _, options = select(load_settings(dtype="bfloat16", executor="torch"), plugins, "executor")
    assert options.dtype == "bfloat16"
    _, options = select(
        load_settings(executor={"name": "torch", "torch": {"dtype": "float16"}}), plugins, "executor"
    )
    assert options.dtype == "float16"  # unset: the executor's own option stands
    _, options = select(
        load_settings(dtype="float32", executor={"name": "torch", "torch": {"dtype": "float16"}}),
        plugins,
        "executor",
    )
    assert options.dtype == "float32"  # like any flag, the top-level setting wins over the section

    import hetero_plugins_mock

    mock = load_plugins(entry_points=[], extra_plugins=[("mock", hetero_plugins_mock)])
    with pytest.raises(ConfigError, match="dtype: executor 'mock' has no dtype option"):
        select(load_settings(dtype="bfloat16", executor="mock"), mock, "executor")
