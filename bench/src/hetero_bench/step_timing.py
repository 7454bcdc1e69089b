"""Host and device time per engine step on a GPU, measured around the executor's ``execute``.

Per step: a CUDA event is recorded before ``execute`` and one after it returns; the host then waits
for the second (``Event.synchronize``) and times that wait. Over a run:

- ``wall``: elapsed time / steps;
- ``host``: wall minus the waits: the engine's and the executor's Python, launches, input building
  (with the executor's work overlapped, a step costs max(host, device), not their sum);
- ``device``: the events' elapsed time: the GPU's span from the step's first queued work to its
  last; when the host launches more slowly than the GPU runs, this span includes the GPU's idle gaps;
- ``wait``: the host blocked on the device.

The wait is made here, just before the sampler's own device-to-host copy of the sampled ids would
make it, so it moves the step's one synchronisation a few kernels earlier (the sampler's argmax is
queued after it instead of before); ``--no-step-timing`` measures tokens/s without it. On a device
without CUDA (a dry run on the CPU) only the host clocks run: device and wait read 0.
"""

from __future__ import annotations

import time


class StepTimer:
    """Wraps ``executor.execute`` (an instance attribute shadows the method) until ``remove()``."""

    def __init__(self, executor, use_cuda: bool):
        self.executor = executor
        self.use_cuda = use_cuda
        self.inner = executor.execute
        self.events: list[tuple[object, object]] = []
        self.wait_s = 0.0
        self.num_steps = 0
        executor.execute = self.execute

    def execute(self, batch):
        import torch

        start = end = None
        if self.use_cuda:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
        output = self.inner(batch)
        if self.use_cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            before = time.perf_counter()
            end.synchronize()
            self.wait_s += time.perf_counter() - before
            self.events.append((start, end))
        self.num_steps += 1
        return output

    def remove(self) -> None:
        del self.executor.execute

    def summary(self, elapsed_s: float) -> dict:
        """Per-step milliseconds over a run that took ``elapsed_s`` (call after the run)."""
        steps = max(1, self.num_steps)
        device_ms = sum(start.elapsed_time(end) for start, end in self.events)
        return {
            "num_steps": self.num_steps,
            "wall_ms_per_step": 1e3 * elapsed_s / steps,
            "host_ms_per_step": 1e3 * (elapsed_s - self.wait_s) / steps,
            "device_ms_per_step": device_ms / steps,
            "wait_ms_per_step": 1e3 * self.wait_s / steps,
        }
