"""Batch files that try to break the run (issue 23, item 10): a bad line fails alone, with an error row
that names its line, in both formats; parsing is bounded; the input or output failing is one line on
stderr and exit 2, the lines already written kept whole. Run through the real CLI in a subprocess
where the exit code and stderr are the point."""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess

import pytest

from tests.cli_helpers import clean_env, hetero, hetero_command

MOCK = ("--executor", "mock")
DEEP = "[" * 100_000 + "]" * 100_000


def strict_rows(path):
    """The rows of a results file, read as strictly as any JSON reader would: UTF-8, complete lines,
    no NaN, no lone surrogate."""
    data = path.read_bytes()
    assert data == b"" or data.endswith(b"\n")
    text = data.decode("utf-8")  # raises on anything that is not UTF-8

    def no_constant(name):
        raise AssertionError(f"{name} in a result row")

    rows = [json.loads(line, parse_constant=no_constant) for line in text.splitlines()]
    for line in text.splitlines():
        line.encode("utf-8")
    return rows


def split_rows(rows, key="id"):
    """({id: row} of the lines that ran, {line number: row} of the lines that could not)."""
    return {r[key]: r for r in rows if "line" not in r}, {r["line"]: r for r in rows if "line" in r}


def native(request_id, **fields):
    return json.dumps({"id": request_id, "prompt": "hi", "max_tokens": 2, **fields})


def openai(custom_id, **body):
    return json.dumps(
        {
            "custom_id": custom_id,
            "method": "POST",
            "url": "/v1/completions",
            "body": {"prompt": "hi", "max_tokens": 2, **body},
        }
    )


def run_file(tmp_path, lines, *extra, out_name="out.jsonl"):
    source = tmp_path / "in.jsonl"
    source.write_text("".join(line + "\n" for line in lines))
    out = tmp_path / out_name
    proc = hetero("run", *MOCK, "--input-file", str(source), "--output", str(out), *extra)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc, out


@pytest.mark.parametrize("make, key", [(native, "id"), (openai, "custom_id")])
def test_a_lone_surrogate_id_fails_its_line_alone_and_resume_works(tmp_path, make, key):
    lines = [make("a"), make("b").replace('"b"', '"\\ud800"'), make("c")]
    proc, out = run_file(tmp_path, lines)
    assert proc.returncode == 1, proc.stderr
    assert "in.jsonl:2: skipped: not valid Unicode: a lone surrogate '\\ud800'" in proc.stderr
    ran, bad = split_rows(strict_rows(out), key)
    assert sorted(ran) == ["a", "c"] and list(bad) == [2] and bad[2][key] is None
    assert "lone surrogate" in json.dumps(bad[2]["error"])

    proc, out = run_file(tmp_path, lines, "--resume")  # the same line again: one row per line, no crash
    assert proc.returncode == 1, proc.stderr
    ran, bad = split_rows(strict_rows(out), key)
    assert sorted(ran) == ["a", "c"] and list(bad) == [2]
    assert len(strict_rows(out)) == 3


BOUND_BREAKERS = [  # (field, JSON value, what the error row says)
    ("prompt", DEEP, "nested deeper than 128 levels"),
    ("seed", "1" * 5000, "an integer of 5000 digits; the limit is 4300"),
    ("temperature", "1" * 400, "invalid value|temperature"),  # 400 digits: too large for a float
    ("presence_penalty", "1" * 400 + ".5", "presence_penalty"),  # a 400-digit float: infinity, refused
    ("top_p", "NaN", "NaN is not a JSON value"),
]


@pytest.mark.parametrize("make, key", [(native, "id"), (openai, "custom_id")])
def test_a_line_that_breaks_a_parsing_bound_is_an_error_row(tmp_path, make, key):
    lines = [make("first")]
    for number, (field, value, _) in enumerate(BOUND_BREAKERS):
        lines.append(make(f"bad{number}", **{field: "VALUE"}).replace('"VALUE"', value))
    # vLLM's extra sampling fields in an OpenAI body are read by the same bounded decoder
    lines += [make("vllm-top-k", top_k=1).replace('"top_k": 1', '"top_k": ' + "9" * 4301), make("last")]
    proc, out = run_file(tmp_path, lines)
    assert proc.returncode == 1, proc.stderr
    ran, bad = split_rows(strict_rows(out), key)
    assert sorted(ran) == ["first", "last"]
    assert sorted(bad) == list(range(2, len(lines)))
    for number, (_, _, message) in enumerate(BOUND_BREAKERS):
        assert re.search(message, json.dumps(bad[number + 2]["error"]))
        assert f"in.jsonl:{number + 2}: skipped:" in proc.stderr
    assert "an integer of 4301 digits" in json.dumps(bad[len(lines) - 1]["error"])


def test_a_fixed_line_runs_on_resume_and_its_error_row_goes(tmp_path):
    lines = [native("a"), native("b", max_tokenz=2), native("c")]
    proc, out = run_file(tmp_path, lines)
    assert proc.returncode == 1
    ran, bad = split_rows(strict_rows(out))
    assert sorted(ran) == ["a", "c"] and bad[2]["id"] == "b" and "max_tokenz" in bad[2]["error"]

    lines[1] = native("b")
    proc, out = run_file(tmp_path, lines, "--resume")
    assert proc.returncode == 0, proc.stderr
    ran, bad = split_rows(strict_rows(out))
    assert sorted(ran) == ["a", "b", "c"] and bad == {}


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize(
    "extra, message",
    [
        (
            (),
            "hetero: error: cannot write --output /dev/full: No space left on device "
            "(after 0 complete result line(s)",
        ),
        # on main this read /dev/full until memory ran out
        (("--resume",), "hetero: error: cannot resume from --output /dev/full: not a regular file"),
    ],
    ids=["write", "resume"],
)
def test_a_full_disk_is_one_line_and_exit_2(tmp_path, extra, message):
    source = tmp_path / "in.jsonl"
    source.write_text(native("a") + "\n")
    proc = hetero("run", *MOCK, "--input-file", str(source), "--output", "/dev/full", *extra)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), proc.stderr


def test_an_output_directory_to_resume_from_is_one_line_and_exit_2(tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text(native("a") + "\n")
    (tmp_path / "results").mkdir()
    proc = hetero(
        "run", *MOCK, "--input-file", str(source), "--output", str(tmp_path / "results"), "--resume"
    )
    assert proc.returncode == 2
    assert (
        proc.stderr.strip()
        == f"hetero: error: cannot write --output {tmp_path / 'results'}: it is a directory; give a file name"
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads and writes files without permission")
def test_an_output_without_permission_is_refused_before_anything_runs(tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text(native("a") + "\n")
    out = tmp_path / "out.jsonl"
    out.write_text("")
    out.chmod(0o400)
    for extra in ((), ("--resume",)):
        proc = hetero("run", *MOCK, "--input-file", str(source), "--output", str(out), *extra)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert "permission denied" in proc.stderr.lower() and len(proc.stderr.strip().splitlines()) == 1


def _file_size_limit(limit):
    def apply():
        signal.signal(
            signal.SIGXFSZ, signal.SIG_IGN
        )  # a write past the limit fails (EFBIG) instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_a_disk_that_fills_mid_run_keeps_every_complete_line_and_resume_finishes(tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text("".join(native(i, max_tokens=1 + i % 3) + "\n" for i in range(30)))
    out = tmp_path / "out.jsonl"
    proc = subprocess.run(
        hetero_command("run", *MOCK, "--input-file", str(source), "--output", str(out)),
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=120,
        env=clean_env({"PYTHONDONTWRITEBYTECODE": "1"}),
        preexec_fn=_file_size_limit(1000),
    )
    assert proc.returncode == 2, proc.stderr
    error = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(error) == 1 and "Traceback" not in proc.stderr
    assert error[0].startswith(f"hetero: error: cannot write --output {out}: File too large (after ")
    kept = strict_rows(out)  # the line cut short by the limit was taken back: complete lines only
    assert 0 < len(kept) < 30 and f"after {len(kept)} complete result line(s)" in error[0]

    proc = hetero("run", *MOCK, "--input-file", str(source), "--output", str(out), "--resume")
    assert proc.returncode == 0, proc.stderr
    rows = strict_rows(out)
    assert rows[: len(kept)] == kept and sorted(r["id"] for r in rows) == list(range(30))


def test_results_on_stdout_stay_utf8_json_lines_past_a_bad_id(tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text(
        native("a") + "\n" + native("b").replace('"b"', '"\\udfff"') + "\n" + native("c") + "\n"
    )
    proc = subprocess.run(
        hetero_command("run", *MOCK, "--input-file", str(source), "--output", "-"),
        capture_output=True,
        stdin=subprocess.DEVNULL,
        env=clean_env(),
        timeout=120,
    )
    assert proc.returncode == 1 and b"Traceback" not in proc.stderr
    rows = [json.loads(line) for line in proc.stdout.decode("utf-8").splitlines()]
    ran, bad = split_rows(rows)
    assert sorted(ran) == ["a", "c"] and bad[2]["id"] is None


@pytest.mark.parametrize(
    "text, value",
    [
        ('{"t": 1e400}', {"t": float("inf")}),  # a huge float reads as infinity; the field's check judges it
        ('{"t": -' + "1" * 400 + ".5}", {"t": float("-inf")}),
        ('{"p": "\\ud83d\\ude00"}', {"p": "\U0001f600"}),  # an escaped pair is one character
        ('{"p": "\\\\ud800"}', {"p": "\\ud800"}),  # an escaped backslash, then text
        ('{"p": "' + "[" * 500 + '"}', {"p": "[" * 500}),  # brackets inside a string do not nest
        ("[" * 128 + "]" * 128, None),
        ("-" + "9" * 4300, None),
    ],
)
def test_the_line_decoder_reads_what_is_within_its_bounds(text, value):
    from hetero_core.batch_files.json_lines import decode_line

    decoded = decode_line(text.encode())
    assert decoded == (value if value is not None else json.loads(text))


@pytest.mark.parametrize(
    "raw, message",
    [
        (b'{"prompt": "hi"\n', "invalid JSON at the end of the line (column 16): Expecting ',' delimiter"),
        (
            b'{"prompt": "x", max_tokens: 3}\r\n',
            "invalid JSON at column 17: Expecting property name enclosed in double quotes",
        ),
        (
            '\ufeff{"prompt": "hi",}\n'.encode(),
            "invalid JSON at column 17: Expecting property name enclosed in double quotes",
        ),  # the byte-order mark is no column
        (b'{"a": 1} x\n', "invalid JSON at column 10: Extra data"),
    ],
)
def test_a_line_that_is_not_json_is_refused_at_a_column_of_that_line(raw, message):
    from hetero_core.batch_files.json_lines import LineError, decode_line

    with pytest.raises(LineError) as error:
        decode_line(raw)
    assert str(error.value) == message


def test_the_line_encoder_always_writes_utf8_json():
    from hetero_core.batch_files.json_lines import encode_line

    data = encode_line({"id": "\ud800", "logprob": float("-inf"), "top": [float("nan"), 1.5], "text": "é😀"})
    assert data.endswith(b"\n")
    assert json.loads(data.decode("utf-8")) == {
        "id": "\ufffd",
        "logprob": None,
        "top": [None, 1.5],
        "text": "é😀",
    }
