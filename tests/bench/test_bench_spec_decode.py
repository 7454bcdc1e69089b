"""`hetero bench spec-decode`: a tiny run on the embedded model (every workload, batch size and arm in
the table and the JSON, greedy outputs equal without speculation) and its one-line mistakes. No speed
is asserted."""

from __future__ import annotations

import json

import pytest

from hetero_core.cli.main import main

TINY = [
    "spec-decode",
    "--batch-sizes",
    "1,2",
    "--output-tokens",
    "6",
    "--rounds",
    "1",
    "--prompt-tokens",
    "16",
    "--dtype",
    "float32",
]


def bench(capsys, *argv):
    code = main(["bench", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow
def test_a_tiny_run_reports_every_arm_with_equal_greedy_outputs(tmp_path, capsys, smollm2_dir):
    path = tmp_path / "spec.json"
    code, out, err = bench(capsys, *TINY, "--json", str(path))
    assert code == 0, err
    assert "machine: " in out and "ms/token p50" in out and "speedup per round" in out
    report = json.loads(path.read_text())
    assert report["benchmark"] == "spec-decode" and set(report["machine"]) >= {"cpu", "cpu_flags", "torch"}
    rows = report["rows"]
    assert [(r["workload"], r["batch"], r["arm"]) for r in rows] == [
        (w, b, a) for w in ("lookup", "random") for b in (1, 2) for a in ("off", "ngram", "draft")
    ]
    assert all(
        r["outputs_equal_off"] is True and r["tok_s"] > 0 and len(r["round_speedups"]) == 1 for r in rows
    )
    off = [r for r in rows if r["arm"] == "off"]
    assert all(r["proposed_tokens"] == 0 and r["acceptance_rate"] is None for r in off)
    # the embedded model is its own draft: it proposes, and the target keeps what it proposes
    drafts = [r for r in rows if r["arm"] == "draft"]
    assert all(r["proposed_tokens"] > 0 and r["accepted_tokens"] > 0 for r in drafts)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--proposers", "eagle"], "--proposers 'eagle': unknown eagle; known: ngram, draft"),
        (["--workloads", "lookup,essay"], "--workloads 'lookup,essay': unknown essay"),
        (["--batch-sizes", "1,x"], "--batch-sizes '1,x': expected positive integers"),
    ],
)
def test_mistakes_are_one_line_and_exit_2(capsys, argv, message):
    code, _, err = bench(capsys, "spec-decode", *argv)
    assert code == 2 and message in err.strip().splitlines()[-1]
