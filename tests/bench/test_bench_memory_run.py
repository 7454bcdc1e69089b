"""``hetero bench memory``: each engine in a process of its own, one after another, measured from
outside (first token, batch-1 decode, peak RSS, OOM), beside a stand-in vLLM (tests/data/fake_vllm);
Hetero runs a tiny random checkpoint with the byte tokenizer. No timing is asserted, only what ran."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from hetero_bench import random_models
from hetero_bench.engine_process import measure
from hetero_bench.peers.vllm_cpu import PYTHON_ENV
from hetero_core.cli.main import main

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
FAKE_VLLM = Path(__file__).parents[1] / "data" / "fake_vllm"
TINY = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 48}


@pytest.fixture
def tiny_model(tmp_path, monkeypatch) -> Path:
    """A one-layer random checkpoint whose vocabulary is the byte tokenizer's (no tokenizer files)."""
    monkeypatch.setattr(random_models, "copy_tokenizer", lambda folder, cache_dir: None)
    config = {**random_models._COMMON, **TINY, "vocab_size": 256, "torch_dtype": "bfloat16"}
    random_models.write_random_model(tmp_path / "tiny", config, "bfloat16")
    monkeypatch.setenv("HETERO_TOKENIZER", "byte")
    monkeypatch.setenv("HETERO_MAX_NUM_BLOCKS", "16")
    return tmp_path / "tiny"


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch) -> None:
    script = tmp_path / "python"
    script.write_text(f'#!/bin/sh\nPYTHONPATH="{FAKE_VLLM}" exec "{sys.executable}" "$@"\n')
    script.chmod(0o755)
    monkeypatch.setenv(PYTHON_ENV, str(script))
    monkeypatch.setenv("FAKE_VLLM_SECONDS_PER_TOKEN", "0.002")


def test_both_engines_run_one_after_another_and_the_ratios_are_hetero_over_vllm(
    tiny_model, fake_vllm, tmp_path, capsys
):
    out_json, out_png = tmp_path / "memory.json", tmp_path / "memory.png"
    plot = ["--plot", str(out_png)] if importlib.util.find_spec("matplotlib") else []
    code = main(
        [
            "bench",
            "memory",
            "--models",
            str(tiny_model),
            "--decode-tokens",
            "64",
            "--json",
            str(out_json),
            *plot,
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out_json.read_text())
    rows = {r["engine"]: r for r in report["rows"]}
    assert list(rows) == ["hetero", "vllm"] and rows["vllm"]["version"] == "0.0.0-fake"
    for row in rows.values():
        assert row["error"] is None and not row["oom_killed"]
        assert row["first_token_s"] > 0 and row["decode_tokens_per_s"] > 0
        assert row["peak_rss_mb"] > 10 and row["hwm_sum_mb"] >= row["peak_rss_mb"] * 0.5
        assert row["processes"] == len(row["hwm_each_mb"]) >= 1  # each process's own peak
        assert row["hwm_max_mb"] == max(row["hwm_each_mb"])
        assert row["hwm_sum_mb"] == pytest.approx(sum(row["hwm_each_mb"]))
        assert row["dtype"] == "bfloat16" and row["checkpoint_gb"] > 0
    [ratios] = report["ratios_hetero_over_vllm"][str(tiny_model)]
    assert ratios["peak_rss_mb"] == pytest.approx(rows["hetero"]["peak_rss_mb"] / rows["vllm"]["peak_rss_mb"])
    assert f"{tiny_model}, round 1: Hetero / vLLM: peak RSS " in out and "memory limit: none" in out
    assert "peak RSS MiB" in out and "cgroup peak MiB" in out and "max VmHWM MiB" in out
    assert not plot or out_png.read_bytes().startswith(b"\x89PNG")


def test_without_vllm_s_venv_hetero_runs_alone_and_says_why(tiny_model, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(PYTHON_ENV, str(tmp_path / "nowhere" / "python"))
    code = main(["bench", "memory", "--models", str(tiny_model), "--decode-tokens", "32"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "skipping vllm: no vLLM venv" in err
    assert "hetero" in out and "Hetero / vLLM" not in out


def test_an_engine_that_dies_is_a_row_with_its_error_and_the_next_still_runs(tmp_path):
    failed = measure(
        [sys.executable, "-c", "raise SystemExit('Error: no such model')"], dict(os.environ), [1], 2, 30
    )
    assert failed.first_token_s is None and not failed.oom_killed
    assert failed.error.startswith("exited with code 1: Error: no such model (its log: /")
    Path(failed.error.rsplit("its log: ", 1)[1].rstrip(")")).unlink()
    silent = measure([sys.executable, "-c", "import time; time.sleep(30)"], dict(os.environ), [1], 2, 0.5)
    assert silent.error.startswith("no answer within 0 s") or silent.error.startswith("no answer within 1 s")
    assert not silent.oom_killed  # killed here, not by the kernel
    Path(silent.error.rsplit("its log: ", 1)[1].rstrip(")")).unlink()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--memory-limit", "21X"], "--memory-limit: expected a size such as 21G"),
        (["--models", "/no/such/dir"], "--models /no/such/dir: /no/such/dir is not an HF directory"),
        (["--prompt", " "], "--prompt is empty"),
        (
            ["--models", "random:llama-9b"],
            "unknown shape 'llama-9b'; available: smollm2-360m, llama-1b, llama-3b",
        ),
    ],
)
def test_mistakes_are_one_line_and_exit_2(argv, message, capsys):
    code = main(["bench", "memory", *argv])
    _, err = capsys.readouterr()
    assert code == 2 and message in err and "Traceback" not in err
