"""A step's inputs reach the device in one host-to-device copy and nothing else waits for the device:
the CUDA path of ``step_inputs`` run on the CPU with a recording double of its device calls
(``transfer_doubles``), the model runner counted step by step, and the engine's step counted for
synchronising calls (one device-to-host copy: the sampled ids)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hetero_core.default_plugins.torch_executor import TorchExecutorOptions
from hetero_core.engine.requests.params import SamplingParams
from hetero_core.engine.sampling.sampler import Sampler, SamplingRow
from hetero_core.model.step_inputs import ALIGN, StepInputs, fill_block_tables
from tests.model.paged_batches import BlockPool, PagedSequence, step
from tests.model.transfer_doubles import RecordingTransfers, SyncRecorder

TORCH_PATH = TorchExecutorOptions(device="cpu", dtype="float32", cpu_kernels="torch")  # the GPU's code path


def test_arrays_of_a_step_go_in_one_copy_as_aligned_views():
    transfers = RecordingTransfers()
    inputs = StepInputs("cpu", transfers=transfers)
    upload = inputs.begin()
    ids = upload.add([5, 6, 7], torch.long)
    lens = upload.add(np.array([3, 1], dtype=np.int64), torch.int32)
    tables = upload.zeros((2, 3), torch.int32)
    fill_block_tables(tables.host, [[4, 9], [7]])
    upload.upload()
    assert transfers.log == ["host_buffer", "copy", "record_event"]
    assert ids.tensor.tolist() == [5, 6, 7] and ids.tensor.dtype == torch.long
    assert lens.tensor.tolist() == [3, 1] and lens.tensor.dtype == torch.int32
    assert tables.tensor.tolist() == [[4, 9, 0], [7, 0, 0]]
    base = ids.tensor.untyped_storage().data_ptr()
    for staged in (ids, lens, tables):  # views of the one device buffer, each aligned
        assert staged.tensor.untyped_storage().data_ptr() == base
        assert (staged.tensor.data_ptr() - base) % ALIGN == 0


def test_two_host_buffers_alternate_and_one_is_refilled_only_after_its_copy():
    transfers = RecordingTransfers()
    inputs = StepInputs("cpu", transfers=transfers)
    for values in ([1], [2], [3]):
        upload = inputs.begin()
        staged = upload.add(values, torch.long)
        upload.upload()
        assert staged.tensor.tolist() == values
    assert transfers.num_copies == inputs.num_copies == 3
    assert transfers.log.count("host_buffer") == 2  # allocated once each, then reused
    third = transfers.log.index("copy", transfers.log.index("copy", transfers.log.index("copy") + 1) + 1)
    assert "event.synchronize" in transfers.log[:third]  # the first buffer's copy was waited for


def test_an_upload_refuses_a_second_call_and_late_arrays():
    upload = StepInputs("cpu", transfers=RecordingTransfers()).begin()
    upload.add([1], torch.long)
    upload.upload()
    with pytest.raises(RuntimeError, match="called twice"):
        upload.upload()
    with pytest.raises(RuntimeError, match="after upload"):
        upload.add([2], torch.long)


def mixed_steps():
    """A prefill, a chunk beside a decode, then pure decodes: every metadata path of a step."""
    a, b = PagedSequence(1, list(range(3, 40)), 30), PagedSequence(2, list(range(50, 75)), 20)
    return [[(a, 30)], [(a, 1), (b, 20)], [(a, 1), (b, 1)], [(a, 1), (b, 1)]]


@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_every_runner_step_is_one_copy_and_the_logits_are_unchanged(name, tiny_model_dirs, make_executor):
    model_dir, _ = tiny_model_dirs[name]
    plain = make_executor(model_dir, options=TORCH_PATH)
    counted = make_executor(model_dir, options=TORCH_PATH)
    transfers = RecordingTransfers()
    counted.runner.inputs = StepInputs("cpu", transfers=transfers)
    pool_a, pool_b = BlockPool(64, shuffle=True, seed=1), BlockPool(64, shuffle=True, seed=1)
    for number, (segments_a, segments_b) in enumerate(zip(mixed_steps(), mixed_steps()), start=1):
        expected = plain.execute(step(segments_a, pool_a, 16)).logits
        got = counted.execute(step(segments_b, pool_b, 16)).logits
        assert transfers.num_copies == number  # one copy per step, whatever its kind
        assert torch.equal(got, expected)


def test_a_runner_step_calls_nothing_that_waits_for_the_device(tiny_model_dirs, make_executor):
    model_dir, _ = tiny_model_dirs["qwen3"]
    executor = make_executor(model_dir, options=TORCH_PATH)
    transfers = RecordingTransfers()
    executor.runner.inputs = StepInputs("cpu", transfers=transfers)
    pool = BlockPool(64)
    for segments in mixed_steps():
        batch = step(segments, pool, 16)
        with SyncRecorder(host=transfers) as recorder:
            executor.execute(batch)
        assert recorder.calls == {}, f"a step called {dict(recorder.calls)}"


def test_greedy_sampling_is_one_device_to_host_copy():
    logits = torch.randn(5, 40)
    logits[3] = float("nan")
    rows = [SamplingRow(SamplingParams(temperature=0), [1], []) for _ in range(5)]
    with SyncRecorder() as recorder:
        out = Sampler().sample(logits, rows)
    assert recorder.calls == {"tolist": 1}
    assert out.token_ids[:3] == logits[:3].argmax(-1).tolist() and out.token_ids[3] == 0
    assert out.error(3) is not None and out.error(4) is None
