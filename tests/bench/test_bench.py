"""`hetero bench`: the list, a small offline run on the mock executor (table, JSON, PNG), peers that
are missing or fake, one-line mistakes, and every other benchmark's smallest run. No timing is
asserted: only what was run, counted and written."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from hetero_bench.catalog import BENCHMARKS
from hetero_bench.peers import PeerResult, PeerUnavailable
from hetero_bench.workload import Workload
from hetero_core.cli.main import main
from tests.cli_helpers import hetero

SMALL_OFFLINE = [
    "offline",
    "--executor",
    "mock",
    "--num-requests",
    "4",
    "--rounds",
    "2",
    "--decode-tokens",
    "4",
]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def bench(capsys, *argv):
    code = main(["bench", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_no_name_lists_every_benchmark_with_what_it_needs(capsys):
    code, out, _ = bench(capsys)
    assert code == 0
    for name in BENCHMARKS:
        assert f"\n{name} " in "\n" + out
    assert "needs: a CUDA GPU" in out and "hetero bench NAME" in out


def test_the_workload_is_the_historical_one():
    requests = Workload().requests(vocab_size=49152)  # SmolLM2's vocabulary: docs/benchmarks.md's figures
    assert len(requests) == 32
    assert sum(len(r.prompt_token_ids) for r in requests) == 2396
    assert sum(r.max_tokens for r in requests) == 1384
    assert all(100 <= t < 49152 for r in requests for t in r.prompt_token_ids)


def test_offline_on_the_mock_executor_prints_a_table_and_writes_json(tmp_path, capsys):
    path = tmp_path / "offline.json"
    code, out, err = bench(capsys, *SMALL_OFFLINE, "--peers", "none", "--json", str(path))
    assert code == 0, err
    assert "machine: " in out and "workload: 4 requests" in out
    assert "hetero engine" in out and "out tok/s" in out and "batch-1 ms/tok" in out
    assert "round 2/2: hetero engine" in err
    report = json.loads(path.read_text())
    assert set(report) >= {"benchmark", "machine", "settings", "rows", "peers", "skipped_peers"}
    assert report["benchmark"] == "offline"
    assert set(report["machine"]) >= {"cpu", "cpu_flags", "num_cpus", "torch", "python"}
    assert report["settings"]["workload"]["num_requests"] == 4
    hetero_row = report["peers"]["hetero"]
    assert hetero_row["hetero_speedup"] == 1.0 and len(hetero_row["rounds"]) == 2
    assert all(r["output_tokens"] == report["settings"]["output_tokens"] for r in hetero_row["rounds"])
    assert hetero_row["decode_ms_per_token"] > 0


def test_seed_and_lengths_change_the_workload(tmp_path, capsys):
    settings = []
    for extra in ([], ["--seed", "1"], ["--output-len", "2", "2"]):
        path = tmp_path / "o.json"
        assert (
            bench(capsys, *SMALL_OFFLINE, "--peers", "none", "--rounds", "1", "--json", str(path), *extra)[0]
            == 0
        )
        settings.append(json.loads(path.read_text())["settings"])
    assert settings[0]["prompt_tokens"] != settings[1]["prompt_tokens"]
    assert settings[2]["output_tokens"] == 4 * 2


def test_plot_writes_a_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = tmp_path / "offline.png"
    code, _, err = bench(capsys, *SMALL_OFFLINE, "--peers", "none", "--plot", str(path))
    assert code == 0, err
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 1000


def test_plot_without_matplotlib_says_what_to_install(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code, out, err = bench(capsys, *SMALL_OFFLINE, "--plot", str(tmp_path / "p.png"))
    assert code == 2 and out == ""  # refused before anything ran
    assert err.strip() == "hetero: error: --plot needs matplotlib: pip install 'hetero-bench[plot]'"


def test_a_peer_without_its_package_is_skipped_with_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` fails, as if not installed
    path = tmp_path / "o.json"
    code, out, err = bench(capsys, *SMALL_OFFLINE, "--peers", "hf", "--json", str(path))
    assert code == 0
    assert (
        "hetero bench: skipping peer 'hf': HF transformers is not installed (pip install transformers torch)"
        in err
    )
    assert json.loads(path.read_text())["skipped_peers"] == {
        "hf": "HF transformers is not installed (pip install transformers torch)"
    }
    assert "hetero engine" in out and "HF generate" not in out


def test_hf_needs_a_real_model(capsys):
    pytest.importorskip("transformers")
    code, _, err = bench(capsys, *SMALL_OFFLINE, "--peers", "hf,hf-sequential")
    assert code == 0
    assert "skipping peer 'hf': needs a real model" in err and "skipping peer 'hf-sequential'" in err


class FakePeer:
    name, label = "fake", "a fake engine"

    def __init__(self, ctx):
        self.ctx, self.calls, self.closed = ctx, 0, False
        FakePeer.last = self

    def run(self, requests):
        self.calls += 1
        return PeerResult(
            elapsed_s=10.0, output_tokens=sum(r.max_tokens for r in requests), extra={"call": self.calls}
        )

    def close(self):
        self.closed = True


def _absent(ctx):
    raise PeerUnavailable("its virtual environment is missing (scripts/setup-absent.sh)")


class FailsToStart(FakePeer):
    name, label = "late", "a peer that fails when it starts"

    def run(self, requests):
        raise PeerUnavailable("its server did not start")


def test_peers_alternate_with_hetero_and_get_ratios(tmp_path, capsys, monkeypatch):
    from hetero_bench import peers

    monkeypatch.setattr(
        peers, "available_peers", lambda: {"fake": FakePeer, "absent": _absent, "late": FailsToStart}
    )
    path = tmp_path / "o.json"
    code, out, err = bench(
        capsys,
        *SMALL_OFFLINE,
        "--decode-tokens",
        "0",
        "--peers",
        "late,fake,absent,fake",
        "--hf-batch-size",
        "3",
        "--json",
        str(path),
    )
    assert code == 0, err
    assert "skipping peer 'absent': its virtual environment is missing" in err
    assert err.count("skipping peer 'late': its server did not start") == 1 and "fails when" not in out
    assert err.index("round 1/2: hetero") < err.index("round 1/2: a fake") < err.index("round 2/2: hetero")
    assert "a fake engine" in out and "a fake engine: hetero speedup per round" in out
    assert FakePeer.last.calls == 2 and FakePeer.last.closed and FakePeer.last.ctx.hf_batch_size == 3
    assert FakePeer.last.ctx.model_dir is None  # the mock executor runs no model
    report = json.loads(path.read_text())
    assert set(report["peers"]) == {"hetero", "fake"} and set(report["skipped_peers"]) == {"absent", "late"}
    fake = report["peers"]["fake"]
    assert fake["seconds"] == 10.0 and fake["hetero_speedup"] > 0
    assert len(fake["hetero_speedup_per_round"]) == 2 and fake["rounds"][1]["call"] == 2


@pytest.mark.parametrize(
    "argv, message",
    [
        (["nope"], "unknown benchmark 'nope'; available: offline, serving"),
        (["ofline"], "did you mean 'offline'?"),
        (["offline", "--num-requests", "0"], "argument --num-requests: expected a positive integer, got 0"),
        (
            ["offline", "--executor", "mock", "--peers", "hf,vllmm"],
            "unknown peer 'vllmm'; available: hf, hf-sequential",
        ),
        (["offline", "--bogus"], "hetero bench offline: unrecognized arguments: --bogus"),
        (
            ["offline", "--executor", "mock", "--prompt-len", "9", "3"],
            "--prompt-len 9 3: MIN must not exceed MAX",
        ),
        (["offline", "--plot", "out.jpg"], "--plot out.jpg: the plot is a PNG"),
        (["offline", "--json", "no/such/dir/o.json"], "--json no/such/dir/o.json: no such directory"),
        (["offline", "--executor", "cdua"], "unknown executor 'cdua'"),
        (
            ["quantization", "--modes", "int8,bf16"],
            "--modes: 'int8,bf16'; choose from bf16, int8, w8a8, fp32, bf16 first",
        ),
        (
            ["serving", "--vocab-low", "300", "--vocab-high", "200", "--base-url", "http://127.0.0.1:9"],
            "--vocab-low 300 is above the highest prompt id 200",
        ),
    ],
)
def test_mistakes_are_one_line_and_exit_2(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    code, out, err = bench(capsys, *argv)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("argv", [["triton-decode"], ["gpu-offline", "--executor", "cuda"]])
def test_gpu_benchmarks_without_cuda_say_they_need_cuda(capsys, argv):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    code, _, err = bench(capsys, *argv)
    assert code == 2 and "needs a CUDA GPU" in err and len(err.strip().splitlines()) == 1


def test_tensor_parallel_on_an_executor_without_it_is_one_line(capsys):
    code, _, err = bench(capsys, "tensor-parallel", "--executor", "mock", "--sizes", "2")
    assert code == 2 and "Traceback" not in err
    assert (
        err.strip()
        .splitlines()[-1]
        .startswith("hetero: error: executor 'mock' does not support tensor parallelism")
    )


def test_pipeline_parallel_on_an_executor_without_it_is_one_line(capsys):
    code, _, err = bench(capsys, "pipeline-parallel", "--executor", "mock", "--layouts", "1x2")
    assert code == 2 and "Traceback" not in err
    assert (
        err.strip()
        .splitlines()[-1]
        .startswith("hetero: error: executor 'mock' does not support pipeline parallelism")
    )


def test_pipeline_parallel_refuses_a_malformed_layout(capsys):
    code, _, err = bench(capsys, "pipeline-parallel", "--layouts", "2by2")
    assert code == 2 and "expected TPxPP such as 1x2, got '2by2'" in err


@pytest.mark.parametrize(
    "argv, first_column",
    [
        (["kv-allocators", "--num-requests", "4"], "paged"),
        (["scheduler-overhead", "--num-requests", "4"], 4),
        (["host-overhead", "--num-seqs", "4", "--rounds", "1", "--output-tokens", "3"], 4),
        (["prefix-cache", "--executor", "mock", "--num-requests", "3", "--system-tokens", "32"], "off"),
        (
            ["parallel-sampling", "--executor", "mock", "--n", "2", "--prompt-tokens", "40", "--rounds", "2"],
            "SamplingParams(n=2)",
        ),
        (["chunked-prefill", "--executor", "mock", "--long-tokens", "64", "--chunk", "16"], "chunked"),
        (["warm-start", "--executor", "mock", "--runs", "1"], 1),
        (["busy-cpu", "--executor", "mock", "--rounds", "1", "--max-tokens", "4"], 1),
        (["tensor-parallel", "--executor", "mock", "--sizes", "1", "--prompts", "2", "--tokens", "4"], 1),
        (
            ["pipeline-parallel", "--executor", "mock", "--layouts", "1x1", "--prompts", "2"],
            "1x1",
        ),
    ],
)
def test_every_cpu_benchmark_runs_small_on_the_mock_executor(tmp_path, capsys, argv, first_column):
    path = tmp_path / "r.json"
    code, out, err = bench(capsys, *argv, "--json", str(path))
    assert code == 0, err
    report = json.loads(path.read_text())
    assert report["benchmark"] == argv[0] and report["rows"]
    assert next(iter(report["rows"][0].values())) == first_column
    assert out.count("\n") >= 3


def test_host_overhead_compares_with_a_baseline_checkout_and_overlaps_a_device(tmp_path, capsys):
    root = Path(__file__).resolve().parents[2]  # this checkout stands in for the baseline
    path = tmp_path / "r.json"
    code, out, err = bench(
        capsys,
        "host-overhead",
        "--num-seqs",
        "3",
        "--rounds",
        "2",
        "--output-tokens",
        "3",
        "--baseline",
        str(root),
        "--step-time",
        "1",
        "--json",
        str(path),
    )
    assert code == 0, err
    report = json.loads(path.read_text())
    assert [r["engine"] for r in report["rows"]] == ["baseline", "this"]
    assert all(r["steps"] == 3 and r["schedule_ms"] is not None for r in report["rows"])
    [comparison] = report["comparisons"]
    assert len(comparison["rounds"]) == 2 and "less engine time than the baseline" in out
    [overlap] = report["overlap"]
    assert overlap["step_time_ms"] == 1 and len(overlap["rounds"]) == 2 and "with async scheduling" in out
    assert "round 2/2: baseline" in err


def test_host_overhead_baseline_must_be_a_checkout(tmp_path, capsys):
    code, _, err = bench(capsys, "host-overhead", "--baseline", str(tmp_path))
    assert code == 2 and "no hetero_core/ there or in its core/" in err


def test_prefix_cache_on_the_mock_executor_hits_and_keeps_the_tokens(tmp_path, capsys):
    # 12 x ~550 tokens: more than one step's 4,096-token budget, so later requests find the prefix cached
    path = tmp_path / "r.json"
    assert (
        bench(
            capsys,
            "prefix-cache",
            "--executor",
            "mock",
            "--num-requests",
            "12",
            "--system-tokens",
            "512",
            "--json",
            str(path),
        )[0]
        == 0
    )
    report = json.loads(path.read_text())
    off, on = report["rows"]
    assert off["hit_rate"] == 0 and on["hit_rate"] > 0 and report["same_tokens"] is True


def test_serving_against_hetero_serve_on_the_mock_executor(tmp_path):
    pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    path = tmp_path / "serving.json"
    proc = hetero(
        "bench",
        "serving",
        "--executor",
        "mock",
        "--concurrency",
        "1",
        "2",
        "--num-prompts",
        "3",
        "--input-len",
        "8",
        "--output-len",
        "4",
        "--json",
        str(path),
        "--",
        "--max-batch-size",
        "4",
    )
    assert proc.returncode == 0, proc.stderr
    assert "scaling 1 -> 2 clients" in proc.stdout
    report = json.loads(path.read_text())
    assert [level["completed"] for level in report["levels"]] == [3, 3]
    assert report["levels"][0]["output_tokens"] == 3 * 4
    assert report["settings"]["serve_flags"] == ["--executor", "mock", "--max-batch-size", "4"]


def test_first_token_runs_time_fresh_hetero_processes(tmp_path, capsys):
    path = tmp_path / "o.json"
    code, out, err = bench(
        capsys, *SMALL_OFFLINE, "--peers", "none", "--first-token-runs", "1", "--json", str(path)
    )
    assert code == 0, err
    assert "load->1st token s" in out
    assert json.loads(path.read_text())["peers"]["hetero"]["first_token_s"] > 0
    code, out, _ = bench(capsys, *SMALL_OFFLINE, "--peers", "none")
    assert "load->1st token" not in out  # 0 runs (the default): not measured, no column


def test_peers_returning_tokens_get_an_agreement_line(capsys, monkeypatch):
    from hetero_bench import peers
    from hetero_bench.benchmarks.offline import _agreement

    class Echo(FakePeer):
        name, label = "echo", "an echo"

        def run(self, requests):
            result = super().run(requests)
            return PeerResult(
                result.elapsed_s, result.output_tokens, {"token_ids": [[-1] * r.max_tokens for r in requests]}
            )  # never the mock's ids

    monkeypatch.setattr(peers, "available_peers", lambda: {"echo": Echo})
    code, out, err = bench(capsys, *SMALL_OFFLINE, "--decode-tokens", "0", "--peers", "echo")
    assert code == 0, err
    assert "an echo: greedy tokens identical to hetero's in 0/4 requests" in out
    hetero, echo = FakePeer(None), Echo(None)
    hetero.name = "hetero"
    assert _agreement([hetero, echo], {"hetero": [[1, 2], [3], [4]], "echo": [[1, 2], [5], [4]]}) == [
        "an echo: greedy tokens identical to hetero's in 2/3 requests (expect all only in the same dtype)"
    ]


def test_workload_flops_counts_linears_lm_head_and_attention():
    from hetero_bench.flops import workload_flops
    from hetero_bench.workload import Request

    config = {
        "hidden_size": 8,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "intermediate_size": 16,
        "vocab_size": 100,
    }
    # one request: 3 prompt tokens, 2 output tokens -> 4 computed tokens, 2 sampled rows
    linears = 2 * 2 * (8 * (2 + 2) * 4 + 2 * 4 * 8 + 3 * 8 * 16)  # per token: q/k/v, o, gate/up/down
    lm_head = 2 * 8 * 100
    attention = 4 * 2 * 2 * 4 * (1 + 2 + 3 + 4)  # token i attends i keys, scores and values
    assert workload_flops(config, [Request([1, 2, 3], 2)]) == 4 * linears + 2 * lm_head + attention


def test_emulate_avx2_caps_the_isa_and_builds_the_kernels_for_haswell(tmp_path, monkeypatch):
    import subprocess
    import tempfile

    from hetero_bench import avx2_emulation

    echo = tmp_path / "echo-cc"
    echo.write_text('#!/bin/sh\necho "$@"\n')
    echo.chmod(0o755)
    for name in (*avx2_emulation.CAPS, "CC"):
        monkeypatch.setenv(name, "unset")  # put back after the test
    monkeypatch.setenv("CC", str(echo))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.delitem(sys.modules, "torch")  # as before torch loads
    variables = avx2_emulation.emulate_avx2()
    assert variables["ATEN_CPU_CAPABILITY"] == "avx2" and variables["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    done = subprocess.run(
        [variables["CC"], "-O3", "-march=native", "-o", "k.so", "k.c"], capture_output=True, text=True
    )
    assert done.stdout.strip() == "-O3 -march=haswell -o k.so k.c"
    assert (
        avx2_emulation.emulate_avx2()["CC"] == variables["CC"]
    )  # again: the same wrapper, not a wrapper of it


def test_emulate_avx2_after_torch_loaded_is_one_line(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", object())
    code, out, err = bench(capsys, *SMALL_OFFLINE, "--peers", "none", "--emulate-avx2")
    assert code == 2 and out == ""
    assert err == (
        "hetero: error: --emulate-avx2: torch is already loaded; the ISA caps must be set before it loads\n"
    )


def test_triton_decode_smoke_runs_the_kernel_through_the_plugins_public_names(tmp_path):
    pytest.importorskip("triton")
    path = tmp_path / "t.json"  # a fresh process: triton's mode (GPU or interpreter) is fixed once imported
    done = hetero(
        "bench", "triton-decode", "--smoke", "--batches", "1", "--contexts", "40", "--json", str(path)
    )
    assert done.returncode == 0, done.stderr
    [row] = json.loads(path.read_text())["rows"]
    assert (row["batch"], row["context"]) == (1, 40) and row["max_abs_error_vs_sdpa"] < 1e-4


def test_gpu_offline_stands_the_flash_attn_double_in_for_flash_attn(monkeypatch):
    pytest.importorskip("torch")
    from hetero_bench.benchmarks.gpu_offline import use_flash_attn_double
    from hetero_plugins_cuda.loader import load_flash_attn

    monkeypatch.setitem(sys.modules, "flash_attn", None)
    use_flash_attn_double(str(Path(__file__).parents[1] / "cuda" / "flash_attn_double.py"))
    kernels = load_flash_attn()  # what the cuda executor calls
    assert kernels.name == "flash-attn 2.x (test double: PyTorch SDPA)"
    assert type(kernels.varlen.__self__).__name__ == "FlashAttnDouble"


def _imports(folder: Path) -> dict[str, set[str]]:
    """Every module each file under ``folder`` imports (function-level imports too)."""
    import ast

    found = {}
    for path in folder.rglob("*.py"):
        names = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
        found[str(path.relative_to(folder))] = names
    return found


# What the benchmarks may import of Hetero: the package's public names, and core's model code for the
# shapes of gpu-offline's synthetic model, and the embedded model (random models take its tokenizer).
PUBLIC = {
    "hetero_core",
    "hetero_core.model.config",
    "hetero_core.model.fusion",
    "hetero_core.model.llama",
    "hetero_core.model.embedded",
    "hetero_core.architectures",  # the architecture facade (hetero bench models)
    "hetero_plugins_triton",
}


def test_the_benchmarks_use_only_public_names_and_core_never_imports_them():
    root = Path(__file__).resolve().parents[2]
    for path, names in _imports(root / "bench" / "src" / "hetero_bench").items():
        private = {n for n in names if n.startswith(("hetero_core", "hetero_plugins")) and n not in PUBLIC}
        assert not private, f"bench/src/hetero_bench/{path} imports {sorted(private)}"
    for path, names in _imports(root / "core" / "src" / "hetero_core").items():
        assert not {n for n in names if n.startswith("hetero_bench")}, (
            f"core/src/hetero_core/{path} imports hetero_bench"
        )


def test_parallel_sampling_runs_the_prompt_once_and_keeps_the_tokens(tmp_path, capsys):
    path = tmp_path / "r.json"
    assert (
        bench(
            capsys,
            "parallel-sampling",
            "--executor",
            "mock",
            "--n",
            "3",
            "--prompt-tokens",
            "40",
            "--output-tokens",
            "4",
            "--rounds",
            "2",
            "--json",
            str(path),
        )[0]
        == 0
    )
    report = json.loads(path.read_text())
    shared, separate = report["rows"]
    # 40 prompt tokens once + the 8 of the partial block twice, vs 40 three times; 3 x 3 decodes each
    assert shared["executor_tokens"] == 40 + 2 * 8 + 9 and separate["executor_tokens"] == 3 * 40 + 9
    assert shared["equal_completions"] is True and separate["equal_completions"] is True


def test_structured_output_benchmark_runs_small_on_the_mock_executor(tmp_path, capsys):
    pytest.importorskip("xgrammar", reason="structured output needs: pip install 'hetero-core[structured]'")
    path = tmp_path / "r.json"
    code, out, err = bench(
        capsys,
        "structured-output",
        "--executor",
        "mock",
        "--num-requests",
        "1",
        "2",
        "--max-tokens",
        "8",
        "--rounds",
        "1",
        "--json",
        str(path),
    )
    assert code == 0, err
    rows = json.loads(path.read_text())["rows"]
    assert [r["num_requests"] for r in rows] == [1, 2] and all(
        r["guided_us"] > 0 and r["free_us"] > 0 for r in rows
    )
    assert "µs of CPU per token" in out


def test_disaggregated_against_one_engine_on_the_mock_executor(tmp_path):
    pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    path = tmp_path / "disaggregated.json"
    proc = hetero(
        "bench",
        "disaggregated",
        "--executor",
        "mock",
        "--long-tokens",
        "40",
        "--num-long",
        "2",
        "--num-decodes",
        "2",
        "--decode-tokens",
        "6",
        "--interval",
        "0.1",
        "--json",
        str(path),
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(path.read_text())
    one, pair = report["rows"]
    assert (one["mode"], pair["mode"]) == ("one engine", "disaggregated")
    assert "prefill_s" not in one and pair["prefill_s"] >= 0 and pair["transfer_s"] >= 0
    assert all(row["itl_p99_ms"] >= row["itl_p50_ms"] >= 0 for row in (one, pair))
    assert len(report["ratios"]) == 1 and "ITL p99 one/pair" in proc.stdout


def test_moe_runs_both_models_small_in_alternating_rounds(tmp_path, capsys, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setenv("HETERO_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "moe.json"
    code, out, err = bench(
        capsys,
        "moe",
        "--hidden",
        "64",
        "--layers",
        "1",
        "--experts",
        "4",
        "--expert-size",
        "32",
        "--rounds",
        "2",
        "--tokens",
        "3",
        "--batch",
        "2",
        "--dtype",
        "float32",
        "--json",
        str(path),
    )
    assert code == 0, err
    report = json.loads(path.read_text())
    assert [row["workload"] for row in report["rows"]] == ["batch 1", "batch 2"]
    assert len(report["rounds"]) == 2 and set(report["rounds"][0]) == {"moe", "dense"}
    configs = {
        d.name.split("-")[2]: json.loads((d / "config.json").read_text())
        for d in (tmp_path / "cache" / "random-models").iterdir()
    }
    assert configs["moe"]["architectures"] == ["Qwen3MoeForCausalLM"] and configs["moe"]["num_experts"] == 4
    assert (
        configs["dense"]["intermediate_size"] == 2 * configs["moe"]["moe_intermediate_size"]
    )  # active params
