"""Test doubles for the device calls of a step, written from torch's documented API, so the CUDA
path's copies and synchronisations can be counted on the CPU.

- ``RecordingTransfers`` stands in for ``step_inputs.CudaTransfers``: ``host_buffer`` (CUDA's is
  ``torch.empty(..., pin_memory=True)``), ``copy`` (``Tensor.copy_(src, non_blocking=True)``, the
  host-to-device copy) and ``record_event`` (``torch.cuda.Event().record()``, whose ``synchronize()``
  blocks the host until the copy is done). It records every call and does the copy on the CPU.
- ``SyncRecorder`` is a ``torch.overrides.TorchFunctionMode`` that records the tensor methods torch's
  CUDA semantics notes list as waiting for the device or copying to the host when a tensor lives on
  a GPU (``item``, ``tolist``, ``cpu``, ``numpy``, ``__bool__``, ``__int__``, ``__float__``,
  ``nonzero``, ``to`` a CPU device), and tensors made from Python data (``torch.tensor``,
  ``as_tensor``: a pageable host-to-device copy when the device is a GPU).
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.overrides import TorchFunctionMode


class RecordedEvent:
    def __init__(self, log: list):
        self.log = log

    def synchronize(self) -> None:
        self.log.append("event.synchronize")


class RecordingTransfers:
    def __init__(self):
        self.log: list[str] = []
        self.host_buffers: list[torch.Tensor] = []
        self.copied_bytes: list[int] = []

    def host_buffer(self, num_bytes: int) -> torch.Tensor:
        self.log.append("host_buffer")
        self.host_buffers.append(torch.empty(num_bytes, dtype=torch.uint8))
        return self.host_buffers[-1]

    def copy(self, destination: torch.Tensor, source: torch.Tensor) -> None:
        if destination.shape != source.shape or destination.dtype != source.dtype:
            raise RuntimeError(f"copy_: {tuple(source.shape)} {source.dtype} into {tuple(destination.shape)}")
        self.log.append("copy")
        self.copied_bytes.append(source.numel())
        destination.copy_(source)

    def record_event(self) -> RecordedEvent:
        self.log.append("record_event")
        return RecordedEvent(self.log)

    @property
    def num_copies(self) -> int:
        return self.log.count("copy")


SYNCING_METHODS = {
    "item",
    "tolist",
    "cpu",
    "numpy",
    "__bool__",
    "__int__",
    "__float__",
    "__index__",
    "nonzero",
}
FACTORIES = {"tensor", "as_tensor"}


class SyncRecorder(TorchFunctionMode):
    """Counts, by name, the calls that would wait for a GPU or copy between host and device there."""

    def __init__(self, host: RecordingTransfers | None = None):
        """``host``: its host buffers are host memory on a GPU machine too; calls on them are not counted."""
        super().__init__()
        self.calls: Counter[str] = Counter()
        self.host = host

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if self.host is not None and args and any(args[0] is buffer for buffer in self.host.host_buffers):
            pass
        elif name in SYNCING_METHODS or name in FACTORIES:
            self.calls[name] += 1
        elif name == "to" and any(_is_cpu(a) for a in (*args[1:], kwargs.get("device"))):
            self.calls["to(cpu)"] += 1
        return func(*args, **kwargs)


def _is_cpu(value) -> bool:
    return (isinstance(value, str) and value.startswith("cpu")) or (
        isinstance(value, torch.device) and value.type == "cpu"
    )
