"""``hetero bench lm-eval``: its tasks ship, its output is read and compared item by item, its mistakes are
one line; and, where lm-eval is installed (``$HETERO_BENCH_LM_EVAL``, or ``/work/peers/lmeval``), a real
run: lm-eval's ``local-completions`` against ``hetero serve`` scores as its ``hf`` model does.

CI cannot be assumed to have lm-eval (it pulls datasets, evaluate, scikit-learn, ...): there the proof is
``tests/server/test_completions_echo_real_model.py``, which replays lm-eval's request shapes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hetero_bench.benchmarks.lm_eval import TOLERANCE, compare
from hetero_bench.lm_eval_run import TASKS, TaskRun, copy_tasks, read_run
from hetero_core import HeteroError
from hetero_core.cli.main import main
from tests.cli_helpers import hetero

LM_EVAL = os.environ.get("HETERO_BENCH_LM_EVAL") or "/work/peers/lmeval/bin/lm_eval"
RUN_TIMEOUT_S = 1800  # two lm_eval runs and hetero serve's start, on 2 shared cores


def bench(capsys, *argv):
    code = main(["bench", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_tasks_ship_with_their_items(tmp_path):
    work = copy_tasks(tmp_path / "tasks")
    names = sorted(p.name for p in work.iterdir())
    assert names == ["hetero_mc.yaml", "hetero_qa.yaml", "multiple_choice.jsonl", "short_answer.jsonl"]
    mc = [json.loads(line) for line in (work / "multiple_choice.jsonl").read_text().splitlines()]
    assert 40 <= len(mc) <= 60
    assert all(len(item["choices"]) == 4 and 0 <= item["answer"] < 4 for item in mc)
    assert sorted({item["answer"] for item in mc}) == [0, 1, 2, 3]  # no position always right
    qa = [json.loads(line) for line in (work / "short_answer.jsonl").read_text().splitlines()]
    assert len(qa) == 20 and all(item["question"] and item["answer"] for item in qa)
    for task in TASKS:
        assert f"task: {task}\n" in (work / f"{task}.yaml").read_text()


def write_run(out: Path, task: str, metrics: dict, samples: list[dict]) -> None:
    folder = out / "some_model"
    folder.mkdir(parents=True)
    (folder / "results_2026.json").write_text(json.dumps({"results": {task: metrics}}))
    (folder / f"samples_{task}_2026.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))


def test_a_run_is_read_and_compared_item_by_item(tmp_path):
    mc = [{"doc_id": 0, "filtered_resps": [["-1.0", "False"], ["-2.5", "True"]]}]
    write_run(tmp_path / "a", "hetero_mc", {"acc,none": 1.0, "acc_stderr,none": 0.1, "alias": "x"}, mc)
    mc[0]["filtered_resps"] = [["-1.0004", "False"], ["-0.5", "True"]]  # a different pick
    write_run(tmp_path / "b", "hetero_mc", {"acc,none": 0.0}, mc)
    a, b = read_run(tmp_path / "a", "hetero_mc"), read_run(tmp_path / "b", "hetero_mc")
    assert a.metrics == {"acc": 1.0} and a.loglikelihoods == {0: [-1.0, -2.5]} and not a.generations
    found = compare(a, b)
    assert found["num_choices"] == 2 and found["max_abs_loglik_delta"] == pytest.approx(2.0)
    assert found["different_picks"] == [0]

    gen = TaskRun({"exact_match": 0.5}, {}, {0: "Paris", 1: "Rome"})
    assert compare(gen, TaskRun({}, {}, {0: "Paris", 1: "Milan"}))["different_generations"] == [1]
    with pytest.raises(HeteroError, match="different items"):
        compare(gen, TaskRun({}, {}, {0: "Paris"}))


def test_the_report_puts_both_sides_in_one_row_and_draws_them(tmp_path):
    pytest.importorskip("matplotlib")
    import argparse

    from hetero_bench.benchmarks.lm_eval import build_report
    from hetero_bench.report import write_plot

    mc = TaskRun({"acc": 0.5}, {0: [-1.0, -2.0]}, {})
    qa = TaskRun({"exact_match": 1.0}, {}, {0: "Paris"})
    runs = {"hetero_mc": (mc, TaskRun({"acc": 0.5}, {0: [-1.0002, -2.0]}, {})), "hetero_qa": (qa, qa)}
    seconds = {"hetero": 1.0, "hf": 2.0}
    report = build_report(argparse.Namespace(limit=1), runs, Path("/m"), "float32", "lm_eval 0", seconds, "x")
    assert report.table.rows[0] == {
        "task": "hetero_mc",
        "metric": "acc",
        "hetero": 0.5,
        "hf": 0.5,
        "equal": True,
    }
    assert any("2.00e-04 over 2 choices of 1 items (within 0.001)" in line for line in report.summary)
    write_plot(report, str(tmp_path / "p.png"))
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_missing_output_is_an_error_naming_it(tmp_path):
    with pytest.raises(HeteroError, match=r"expected one results_\*\.json"):
        read_run(tmp_path, "hetero_mc")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--lm-eval", "/no/such/lm_eval"], "--lm-eval /no/such/lm_eval: not an executable file"),
        (["--lm-eval", "/bin/true", "--model", "/no/such/model"], "needs an HF model directory"),
        (["--tasks", "mmlu"], "invalid choice: 'mmlu'"),
        (["--limit", "0"], "expected a positive integer"),
    ],
)
def test_mistakes_are_one_line_and_exit_2(capsys, argv, message):
    code, _, err = bench(capsys, "lm-eval", *argv)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_without_lm_eval_it_says_how_to_install_it(capsys, monkeypatch):
    monkeypatch.delenv("HETERO_BENCH_LM_EVAL", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    code, _, err = bench(capsys, "lm-eval")
    assert code == 2 and "lm_eval not found" in err and "lm-eval[api,hf]" in err


@pytest.mark.slow
@pytest.mark.skipif(
    not os.access(LM_EVAL, os.X_OK),
    reason=f"lm-eval is not installed at {LM_EVAL} (set HETERO_BENCH_LM_EVAL to its lm_eval program)",
)
def test_local_completions_against_hetero_serve_scores_as_lm_eval_hf(smollm2_dir, tmp_path):
    """The real thing, on the first 8 items of each task: same accuracies, loglikelihoods within 1e-3."""
    report = tmp_path / "report.json"
    kept = tmp_path / "kept"
    argv = ["bench", "lm-eval", "--lm-eval", LM_EVAL, "--limit", "8", "--json", str(report)]
    argv += ["--num-concurrent", "2", "--output-dir", str(kept)]
    done = hetero(*argv, timeout=RUN_TIMEOUT_S)  # a process, as a user runs it: hetero serve inherits stderr
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    results = json.loads(report.read_text())
    assert {row["task"] for row in results["rows"]} == set(TASKS)
    assert all(row["equal"] for row in results["rows"]), results["rows"]
    mc, qa = results["comparisons"]["hetero_mc"], results["comparisons"]["hetero_qa"]
    assert mc["num_choices"] == 32 and mc["max_abs_loglik_delta"] <= TOLERANCE
    assert mc["different_picks"] == [] and qa["different_generations"] == []
    assert "max |delta loglikelihood|" in out and "lm_eval" in results["versions"]
    assert "num_concurrent=2" in out
    for side in ("hetero", "hf"):
        assert len(list((kept / side).rglob("samples_hetero_*.jsonl"))) == 2
