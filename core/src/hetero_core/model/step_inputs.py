"""A step's index arrays on the device in one host-to-device copy.

Every step an executor turns the ``Batch``'s lists into tensors: token ids, positions, slot
mapping, context lengths, block tables, the sampled rows. Made one tensor at a time, each is a
copy of its own, and on a CUDA device a copy from ordinary (pageable) host memory first waits for
the GPU to finish everything queued before it, so the host cannot run ahead of the device.

Here a step's arrays are written with numpy into a preallocated pinned host buffer and copied, all
at once, with one asynchronous copy into a preallocated device buffer; each consumer gets a view of
it. Two host buffers alternate, and one is refilled only after the copy that last read it is done
(an event per buffer; by then that step has long finished, so the wait costs nothing): the host can
fill step N + 1 while step N's copy is still queued. The device buffer is one, reused every step:
kernels that read step N's views are queued before step N + 1's copy on the same stream.

On the CPU nothing is copied: each array becomes a tensor sharing its memory (``torch.from_numpy``),
and no memory is pinned (pinning needs CUDA). The device calls themselves (``CudaTransfers``) can be
replaced, so tests on the CPU run the CUDA path with a recording double and count its copies.

Usage, once per step::

    upload = step_inputs.begin()
    ids = upload.add(batch.token_ids, torch.long)
    tables = upload.zeros((num_seqs, width), torch.int32)   # fill tables.host (numpy) in place
    upload.upload()
    ids.tensor, tables.tensor                                # on the device
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import torch

NUMPY_DTYPES = {torch.int64: np.int64, torch.int32: np.int32, torch.bool: np.bool_, torch.float32: np.float32}
ALIGN = 64  # bytes between arrays in the buffers: every view starts aligned for vector loads
MIN_CAPACITY = 1 << 20


class Staged:
    """One array of a step: ``host`` (numpy, fill it before ``upload``), then ``tensor`` (on the device)."""

    __slots__ = ("host", "dtype", "tensor")

    def __init__(self, host: np.ndarray, dtype: torch.dtype):
        self.host = host
        self.dtype = dtype
        self.tensor: torch.Tensor | None = None


class CudaTransfers:
    """The device calls an upload makes, from torch's documented CUDA API: pinned host memory
    (``pin_memory=True``), one asynchronous copy (``Tensor.copy_(..., non_blocking=True)``) and an
    event recorded after it (``torch.cuda.Event``). Tests stand a recording double in for it."""

    def host_buffer(self, num_bytes: int) -> torch.Tensor:
        return torch.empty(num_bytes, dtype=torch.uint8, pin_memory=True)

    def copy(self, destination: torch.Tensor, source: torch.Tensor) -> None:
        destination.copy_(source, non_blocking=True)

    def record_event(self):
        event = torch.cuda.Event()
        event.record()
        return event


class StepInputs:
    """The buffers of one executor's per-step inputs on ``device`` (kept for the executor's life).
    ``transfers``: how arrays reach the device (default: ``CudaTransfers`` on a CUDA device; none on
    the CPU, where each array is a tensor over its numpy memory)."""

    def __init__(self, device: torch.device | str, transfers: CudaTransfers | None = None):
        self.device = torch.device(device)
        self.transfers = (
            transfers if transfers is not None else (CudaTransfers() if self.device.type == "cuda" else None)
        )
        self._host: list[torch.Tensor | None] = [None, None]
        self._copied: list = [None, None]  # the event after each host buffer's last copy
        self._next = 0
        self._device_buffer: torch.Tensor | None = None
        self.num_copies = 0  # host-to-device copies made (one per step that uploads anything)

    def begin(self) -> StepUpload:
        """A fresh step: add its arrays, then ``upload()`` once."""
        return StepUpload(self)

    def _upload(self, arrays: list[Staged], into: torch.Tensor | None) -> None:
        if into is None and self.transfers is None:
            for staged in arrays:  # the CPU: no packing, no copy
                staged.tensor = torch.from_numpy(staged.host)
                if self.device.type != "cpu":
                    staged.tensor = staged.tensor.to(self.device)
            return
        offsets, total = _layout([(a.host.shape, a.dtype) for a in arrays])
        destination = into if into is not None else self._device_bytes(total)
        if destination.numel() < total:
            raise ValueError(
                f"StepUpload.upload(into=...): the step needs {total} bytes, the buffer has "
                f"{destination.numel()}"
            )
        if self.transfers is not None:
            host = self._host_buffer(total)
            _pack(host.numpy(), arrays, offsets)
            self.transfers.copy(destination[:total], host[:total])
            self._copied[self._next] = self.transfers.record_event()
            self._next ^= 1
            self.num_copies += 1
        else:  # a static buffer on the CPU (decode graphs emulated): written in place
            _pack(destination.numpy(), arrays, offsets)
        views = packed_views(destination, [(a.host.shape, a.dtype) for a in arrays])
        for staged, view in zip(arrays, views):
            staged.tensor = view

    def _host_buffer(self, size: int) -> torch.Tensor:
        """The next host buffer (pinned), free to refill and holding at least ``size`` bytes."""
        index = self._next
        if self._copied[index] is not None:
            self._copied[index].synchronize()  # its last copy is done (normally long ago)
        host = self._host[index]
        if host is None or host.numel() < size:
            host = self.transfers.host_buffer(_capacity(size))
            self._host[index] = host
        return host

    def _device_bytes(self, size: int) -> torch.Tensor:
        if self._device_buffer is None or self._device_buffer.numel() < size:
            self._device_buffer = torch.empty(_capacity(size), dtype=torch.uint8, device=self.device)
        return self._device_buffer


class StepUpload:
    """One step's arrays, uploaded together by ``upload()``."""

    def __init__(self, inputs: StepInputs):
        self.inputs = inputs
        self.arrays: list[Staged] = []
        self.is_uploaded = False

    @property
    def device(self) -> torch.device:
        return self.inputs.device

    def add(self, values, dtype: torch.dtype) -> Staged:
        """``values`` (a sequence of numbers or a numpy array) as a ``dtype`` tensor on the device."""
        return self._staged(np.asarray(values, dtype=NUMPY_DTYPES[dtype]), dtype)

    def zeros(self, shape: tuple[int, ...], dtype: torch.dtype) -> Staged:
        """A zeroed array whose ``host`` view the caller fills before ``upload()``."""
        return self._staged(np.zeros(shape, dtype=NUMPY_DTYPES[dtype]), dtype)

    def upload(self, into: torch.Tensor | None = None) -> None:
        """Copy every array added so far to the device (once per step); ``tensor`` of each is set.
        ``into``: a uint8 buffer on the device to copy into (its views ``packed_views`` gives, for
        static addresses such as a CUDA graph's inputs); None: the inputs' own buffer."""
        if self.is_uploaded:
            raise RuntimeError("StepUpload.upload() called twice for one step")
        self.is_uploaded = True
        if self.arrays:
            self.inputs._upload(self.arrays, into)

    def _staged(self, host: np.ndarray, dtype: torch.dtype) -> Staged:
        if self.is_uploaded:
            raise RuntimeError("StepUpload: an array was added after upload(); add every array first")
        staged = Staged(host, dtype)
        self.arrays.append(staged)
        return staged


def check_block_tables(batch) -> None:
    """Every sequence's block table holds its context (an allocator bug otherwise, named here rather
    than as an out-of-range read in a kernel)."""
    for i in range(batch.num_seqs):
        capacity = len(batch.block_tables[i]) * batch.block_size
        if capacity < batch.context_lens[i]:
            raise ValueError(
                f"sequence {batch.seq_ids[i]}: block table holds {capacity} slots but context_len is "
                f"{batch.context_lens[i]}; the allocator must assign enough blocks before execute()"
            )


def fill_block_tables(out: np.ndarray, tables: Sequence[Sequence[int]]) -> np.ndarray:
    """Write ``tables`` (one list of block numbers per row) into the rows of ``out`` (``[len(tables),
    width]``, already zeroed: shorter tables stay padded with block 0). All rows in one numpy
    assignment: about 3x faster than a row at a time, 6x faster than ``torch.tensor`` of padded lists."""
    lengths = np.fromiter(map(len, tables), dtype=np.int64, count=len(tables))
    flat = np.array(list(itertools.chain.from_iterable(tables)), dtype=out.dtype)
    if flat.size:
        out[np.arange(out.shape[1])[None, :] < lengths[:, None]] = flat
    return out


def packed_size(shapes: list[tuple[tuple[int, ...], torch.dtype]]) -> int:
    """Bytes a step of arrays of these (shape, dtype) takes in the buffers."""
    return _layout(shapes)[1]


def packed_views(
    buffer: torch.Tensor, shapes: list[tuple[tuple[int, ...], torch.dtype]]
) -> list[torch.Tensor]:
    """The arrays of these (shape, dtype), in order, as views of the uint8 ``buffer``, where an upload
    of arrays of these shapes puts them."""
    offsets, _ = _layout(shapes)
    views = []
    for (shape, dtype), offset in zip(shapes, offsets):
        size = int(np.prod(shape)) * _itemsize(dtype)
        views.append(buffer[offset : offset + size].view(dtype).view(shape))
    return views


def _pack(out: np.ndarray, arrays: list[Staged], offsets: list[int]) -> None:
    for staged, offset in zip(arrays, offsets):
        out[offset : offset + staged.host.nbytes] = (
            np.ascontiguousarray(staged.host).reshape(-1).view(np.uint8)
        )


def _layout(shapes) -> tuple[list[int], int]:
    offsets, total = [], 0
    for shape, dtype in shapes:
        offsets.append(total)
        total += -(-int(np.prod(shape)) * _itemsize(dtype) // ALIGN) * ALIGN
    return offsets, total


def _itemsize(dtype: torch.dtype) -> int:
    return np.dtype(NUMPY_DTYPES[dtype]).itemsize


def _capacity(size: int) -> int:
    return max(MIN_CAPACITY, 1 << (size - 1).bit_length())
