"""``hetero run`` answered by a running ``hetero serve`` of the real embedded SmolLM2: the same tokens
as the run computes itself, chat and raw, one prompt streamed and several batched."""

from __future__ import annotations

import os

import pytest

from tests.cli.serve_process import running_serve
from tests.cli_helpers import hetero

pytest.importorskip("uvicorn")


def test_a_serve_of_the_embedded_model_answers_with_the_local_runs_tokens(smollm2_dir, tmp_path):
    # The record goes to --cache-dir (a fresh one); the compiled kernels stay in the shared cache.
    shared = {"HETERO_CACHE_DIR": os.environ.get("HETERO_CACHE_DIR")}
    engine = ("--model", str(smollm2_dir), "--cache-dir", str(tmp_path), "--dtype", "float32")
    engine += ("--max-num-blocks", "256")
    with running_serve(tmp_path, *engine, env=shared):
        for args in (
            ("--max-tokens", "16", "What is the capital of France?"),
            ("--max-tokens", "12", "--no-chat", "The capital of France is"),
            ("--max-tokens", "10", "--temperature", "0.7", "--seed", "5", "Name a colour."),
            ("--max-tokens", "8", "Say hi.", "Count to three."),
        ):
            reused = hetero("run", *engine, *args, env={**shared, "HETERO_REUSE_SERVER": "true"})
            alone = hetero("run", *engine, "--no-reuse-server", *args, env=shared)
            assert reused.returncode == alone.returncode == 0, reused.stderr + alone.stderr
            assert "answered by hetero serve at" in reused.stderr, reused.stderr
            assert ", load " in alone.stderr
            assert reused.stdout == alone.stdout and reused.stdout.strip()
