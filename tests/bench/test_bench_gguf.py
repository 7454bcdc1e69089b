"""`hetero bench gguf`: llama.cpp's perplexity method (chunks, BOS, the scored half, the +/-), its
tools found and their output read (fake tools that print what the real ones print and record their
arguments), the whole benchmark on the mock executor beside the fake llama.cpp, and its mistakes."""

from __future__ import annotations

import json
import math
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

from hetero_bench.chunked_perplexity import chunked_perplexity, perplexity_chunks, perplexity_summary
from hetero_bench.peers import PeerUnavailable
from hetero_bench.peers.llama_cpp import LlamaCpp, find_tool
from hetero_core import HeteroError
from hetero_core.cli.main import main

FAKE_TOOLS = {
    "llama-bench": """if [ "$1" = --version ]; then echo "version: 11434 (fake)" >&2; exit 0; fi
echo '[{"avg_ts": 50.0, "stddev_ts": 1.5, "samples_ts": [49.0, 50.0, 51.0], "n_gen": 128}]'""",
    "llama-batched-bench": """echo 'main: n_kv_max = 4096'
echo '{"pp": 72, "tg": 40, "pl": 32, "t_pp": 2.0, "speed_pp": 1152.0, "t_tg": 6.0, "speed_tg": 213.3}'""",
    "llama-perplexity": """echo 'perplexity: calculating perplexity over 2 chunks, n_ctx=512' >&2
echo '[1]12.0,[2]12.5,' ; echo 'Final estimate: PPL = 12.5000 +/- 0.40000' >&2""",
}


@pytest.fixture
def fake_llama_cpp(tmp_path) -> Path:
    """A folder of fake llama.cpp tools (in bin/, as a build folder has them) that log their argv."""
    folder = tmp_path / "llama.cpp-build" / "bin"
    folder.mkdir(parents=True)
    for name, body in FAKE_TOOLS.items():
        script = folder / name
        script.write_text(f'#!/bin/sh\necho "{name} $*" >> "{tmp_path}/argv.log"\n{body}\n')
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return folder.parent


def test_chunks_are_whole_n_ctx_windows_each_starting_with_bos():
    chunks = perplexity_chunks(list(range(10, 35)), 8, bos_id=1)  # 26 tokens with the BOS: 3 chunks
    assert chunks.num_text_tokens == 26
    assert chunks.prompts == [[1, *range(10, 17)], [1, *range(18, 25)], [1, *range(26, 33)]]
    assert chunks.first_scored == 5  # logits 4..6 score tokens 5..7: n_ctx - 1 - n_ctx/2 = 3 a chunk


def test_without_bos_the_chunks_are_the_tokens_as_they_are():
    chunks = perplexity_chunks(list(range(16)), 8, bos_id=None)
    assert chunks.prompts == [list(range(8)), list(range(8, 16))]


@pytest.mark.parametrize(
    "ids, n_ctx, message",
    [(list(range(15)), 8, "needs at least 16"), (list(range(40)), 7, "even number"), ([1] * 8, 2, ">= 4")],
)
def test_short_texts_and_odd_contexts_are_refused(ids, n_ctx, message):
    with pytest.raises(HeteroError, match=message):
        perplexity_chunks(ids, n_ctx, bos_id=None)


def test_only_the_second_half_of_each_chunk_is_scored():
    def entry(token, logprob):
        return {token: SimpleNamespace(logprob=logprob)}

    class FakeLLM:  # the first half scores -100 a token: any of it counted would show
        def generate(self, prompts, params, use_tqdm):
            assert params.prompt_logprobs == 0 and params.max_tokens == 1
            return [
                SimpleNamespace(
                    prompt_token_ids=p["prompt_token_ids"],
                    prompt_logprobs=[None] + [entry(t, -100.0 if i < 5 else math.log(0.25))
                                              for i, t in enumerate(p["prompt_token_ids"][1:], 1)],
                )
                for p in prompts
            ]  # fmt: skip

    result = chunked_perplexity(FakeLLM(), perplexity_chunks(list(range(16)), 8, bos_id=None))
    assert result["scored_tokens"] == 6 and result["chunks"] == 2
    assert math.isclose(result["perplexity"], 4.0) and result["perplexity_error"] < 1e-6


def test_the_error_is_llama_cpps_plus_minus():
    nll = [1.0, 2.0, 3.0, 2.0]
    result = perplexity_summary(nll, 1)
    std = math.sqrt((sum(x * x for x in nll) / 4 - 4.0) / 3)
    assert math.isclose(result["perplexity"], math.exp(2.0))
    assert math.isclose(result["perplexity_error"], math.exp(2.0) * std)


def test_llama_cpp_tools_are_run_with_the_shapes_and_their_output_read(fake_llama_cpp, tmp_path):
    peer = LlamaCpp("model.gguf", str(fake_llama_cpp), threads=2)
    assert peer.version == "version: 11434 (fake)"
    decode = peer.decode_tokens_per_s(72, 128, 3)
    assert decode == {"tok_s": 50.0, "stddev": 1.5, "samples": [49.0, 50.0, 51.0]}
    parallel = peer.parallel_tokens_per_s(32, 72, 41)
    assert math.isclose(parallel["tok_s"], 32 * 41 / 8.0) and parallel["decode_tok_s"] == 213.3
    assert peer.perplexity("text.txt", 512) == {"perplexity": 12.5, "perplexity_error": 0.4, "chunks": 2}
    argv = (tmp_path / "argv.log").read_text()
    assert "llama-bench -m model.gguf -t 2 -p 0 -n 128 -d 72 -r 3 -o json" in argv
    assert "-c 3616 -b 2048 -ub 512 -npp 72 -ntg 40 -npl 32" in argv  # 40 steps: 41 tokens a sequence
    assert "llama-perplexity -m model.gguf -f text.txt -c 512 -b 512 -t 2" in argv


def test_a_missing_tool_names_itself_and_the_fix(tmp_path, monkeypatch):
    with pytest.raises(PeerUnavailable, match="no llama-bench in .* --llama-cpp DIR"):
        find_tool("llama-bench", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(PeerUnavailable, match="llama-perplexity is not on PATH"):
        find_tool("llama-perplexity", None)


def test_bench_gguf_beside_fake_llama_cpp_on_the_mock_executor(fake_llama_cpp, tmp_path, capsys):
    path = tmp_path / "r.json"
    argv = ["--executor", "mock", "--prompt-tokens", "8", "--output-tokens", "4", "--parallel", "4"]
    argv += ["--parallel-output-tokens", "3", "--rounds", "1", "--llama-cpp", str(fake_llama_cpp)]
    code = main(["bench", "gguf", *argv, "--json", str(path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    rows = json.loads(path.read_text())["rows"]
    assert [r["engine"] for r in rows] == ["hetero", "llama.cpp"]
    assert rows[0]["tok_s_1"] > 0 and rows[1]["tok_s_1"] == 50.0
    assert math.isclose(rows[1]["tok_s_parallel"], 4 * 3 / 8.0)
    assert "hetero / llama.cpp batch-1 tok/s" in out and "version: 11434 (fake)" in out
    assert "-npp 8 -ntg 2 -npl 4" in (tmp_path / "argv.log").read_text()


def test_without_llama_cpp_hetero_runs_alone_and_says_why(tmp_path, capsys):
    argv = ["--executor", "mock", "--prompt-tokens", "8", "--output-tokens", "2", "--parallel", "2"]
    code = main(["bench", "gguf", *argv, "--rounds", "1", "--llama-cpp", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "skipping llama.cpp: no llama-bench in" in err and "llama.cpp not run" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model", "model.safetensors"], "expected an existing .gguf file"),
        (["--no-speed"], "measures nothing"),
        (["--perplexity", "/no/such/text.txt"], "no such file"),
        (["--perplexity", "shipped", "--llama-cpp", "none"], "prompt_logprobs is not supported"),
        (["--threads", "0"], "expected a positive integer"),
        (["--code-activations", "int8"], "--code-activations: the torch executor's options"),
        (["--no-amx-linears"], "--amx-linears: the torch executor's options"),
    ],
)
def test_mistakes_are_one_line_and_exit_2(argv, message, capsys):
    code = main(["bench", "gguf", "--executor", "mock", *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err


def test_the_torch_executors_options_come_from_the_flags():
    from hetero_bench.benchmarks.gguf import executor_options

    args = SimpleNamespace(executor="torch", threads=2, code_activations="int8", amx_linears=False)
    assert executor_options(args) == {"num_threads": 2, "code_activations": "int8", "amx_linears": False}
    args = SimpleNamespace(executor="torch", threads=3, code_activations=None, amx_linears=None)
    assert executor_options(args) == {"num_threads": 3}  # the executor's defaults
    args = SimpleNamespace(executor="mock", threads=3, code_activations=None, amx_linears=None)
    assert executor_options(args) is None


def test_the_longer_shipped_text_is_the_gpl_verbatim_and_read_in_place():
    """``--perplexity gpl-3``: the package's own copy of the GNU GPL v3, handed to llama-perplexity as it
    lies (no temporary copy to remove), long enough for many more 512-token chunks than 'shipped'."""
    from hetero_bench.benchmarks import gguf as gguf_bench

    path, text = gguf_bench._text(gguf_bench.GPL3)
    assert Path(path).parent.name == "data" and Path(path).read_text(encoding="utf-8") == text
    assert text.lstrip().startswith("GNU GENERAL PUBLIC LICENSE") and "Version 3, 29 June 2007" in text
    shipped_path, shipped = gguf_bench._text(gguf_bench.SHIPPED)
    Path(shipped_path).unlink()  # the shipped text's temporary copy
    assert len(text) > 5 * len(shipped)
