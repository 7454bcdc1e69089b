"""KV transfer: whole KV blocks leaving one engine (prefill) and entering another (decode).

What moves (``KVBlocks``): for each decoder layer, the executor's K/V tensors holding exactly the
exported blocks, in the executor's own layout (blocks along ``block_dim``), as raw bytes with their
dtype and shape (``KVTensor``); the ``block_size``; and the token ids those blocks hold (the prompt:
the last block may be partly filled, its tail slots are junk the decode engine overwrites).

A decode engine takes such blocks with a request (``KVHandoff``: the prompt's blocks plus the first
token the prefill engine sampled): ``engine.add_request(prompt_token_ids, params, kv_transfer=...)``.
It allocates the blocks, writes them through the executor's ``import_blocks`` before the request's
first decode, and counts the prompt as computed. Blocks its prefix cache already holds are not
written again. Moving the bytes between processes is a connector's job (``KVConnector``; the seam
``kv_connector``, docs/disaggregation.md).

Importing this module imports no torch: the torch helpers import it when called.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from hetero_core.errors import HeteroError

__all__ = [
    "KVBlocks",
    "KVConnector",
    "KVConnectorContext",
    "KVHandoff",
    "KVTensor",
    "KVTransferError",
    "export_prompt_blocks",
    "kv_import_error",
    "kv_tensor_from_torch",
    "kv_tensor_to_torch",
    "without_first_blocks",
]


class KVTransferError(HeteroError):
    """A KV transfer failed: the peer is gone, timed out, or sent blocks that do not fit."""


@dataclass(frozen=True)
class KVTensor:
    """One tensor of one layer: ``dtype`` as torch names it without the prefix (``float32``,
    ``bfloat16``, ``int64``), ``shape`` in the executor's layout, ``data`` its bytes (C order)."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes | bytearray | memoryview

    @property
    def num_bytes(self) -> int:
        return len(self.data) if not isinstance(self.data, memoryview) else self.data.nbytes


@dataclass(frozen=True)
class KVBlocks:
    """The K/V of ``num_blocks`` whole blocks, in order: ``layers[i]`` is layer i's tensors (K and V
    for the torch executor; the mock executor exports one tensor of token ids), each with the blocks
    along ``block_dim``. ``token_ids``: the tokens the blocks hold, in order (up to
    ``num_blocks * block_size`` of them)."""

    block_size: int
    block_dim: int
    layers: tuple[tuple[KVTensor, ...], ...]
    token_ids: tuple[int, ...]

    @property
    def num_blocks(self) -> int:
        return -(-len(self.token_ids) // self.block_size)

    @property
    def num_bytes(self) -> int:
        return sum(t.num_bytes for layer in self.layers for t in layer)

    def problem(self, prompt_token_ids: list[int], block_size: int) -> str | None:
        """Why these blocks cannot serve as the K/V of ``prompt_token_ids`` in an engine of
        ``block_size``, or None."""
        if self.block_size != block_size:
            return (
                f"the KV blocks have block_size {self.block_size} but this engine's is {block_size}; "
                "run both engines with the same --block-size"
            )
        if list(self.token_ids) != list(prompt_token_ids):
            return (
                f"the KV blocks hold {len(self.token_ids)} tokens that are not the request's prompt "
                f"({len(prompt_token_ids)} tokens); send the prompt the prefill engine ran"
            )
        return None


@dataclass(frozen=True)
class KVHandoff:
    """What a decode engine needs to continue a request another engine prefilled: the prompt's KV
    blocks and the first token sampled from them (with its logprobs entry when asked for)."""

    first_token_id: int
    blocks: KVBlocks
    first_logprobs: Any = None
    timings: dict = field(default_factory=dict)  # seconds: prefill, transfer (for metrics and benchmarks)


@dataclass(frozen=True)
class KVConnectorContext:
    """What a connector factory receives: its validated options (or None)."""

    options: Any


@runtime_checkable
class KVConnector(Protocol):
    """Moves ``KVBlocks`` from the engine that published them to one that fetches them (contract:
    docs/disaggregation.md; kit: ``hetero_core.testing.KVConnectorContract``).

    - ``publish(transfer_id, blocks) -> address``: keep ``blocks`` until fetched once (or expired);
      the address tells a fetcher where to ask. Never blocks on a peer.
    - ``fetch(address, transfer_id, timeout) -> KVBlocks``: the published blocks, byte for byte, or
      ``KVTransferError`` within about ``timeout`` seconds (unknown id, peer gone, cut short).
    - ``discard(transfer_id)``: drop a published transfer nobody will fetch (no error if unknown).
    - ``close()``: stop serving; later fetches of its transfers fail.
    """

    def publish(self, transfer_id: str, blocks: KVBlocks) -> str: ...

    def fetch(self, address: str, transfer_id: str, timeout: float) -> KVBlocks: ...

    def discard(self, transfer_id: str) -> None: ...

    def close(self) -> None: ...


def kv_import_error(seq, scheduler, executor) -> str | None:
    """Why ``seq``'s ``kv_import`` (a KVHandoff) cannot be taken by this engine, or None."""
    handoff: KVHandoff = seq.kv_import
    if not executor.capabilities.kv_import:
        return (
            f"this engine's executor ({type(executor).__name__}) cannot import KV blocks (it does not "
            "declare kv_import)"
        )
    if not isinstance(handoff, KVHandoff):
        return f"kv_transfer must be a KVHandoff, got {type(handoff).__name__}"
    if seq.params.prompt_logprobs is not None:
        return "prompt_logprobs need the prompt computed here; a request with kv_transfer cannot have them"
    if not isinstance(handoff.first_token_id, int) or isinstance(handoff.first_token_id, bool):
        return f"kv_transfer.first_token_id must be an int, got {handoff.first_token_id!r}"
    return handoff.blocks.problem(seq.prompt_token_ids, scheduler.allocator.block_size)


def export_prompt_blocks(executor, seq, block_size: int) -> tuple[KVBlocks | None, str | None]:
    """(the KV blocks of ``seq``'s prompt, None), or (None, why they could not be exported)."""
    num_prompt = len(seq.prompt_token_ids)
    if not executor.capabilities.kv_export:
        return None, (
            f"this engine's executor ({type(executor).__name__}) cannot export KV blocks (it does "
            "not declare kv_export)"
        )
    if seq.num_confirmed_tokens < num_prompt:
        return None, f"only {seq.num_confirmed_tokens} of the prompt's {num_prompt} tokens have K/V to export"
    try:
        layers = executor.export_blocks(seq.block_table[: -(-num_prompt // block_size)])
    except Exception as exc:
        return None, f"the executor failed to export the prompt's KV blocks: {type(exc).__name__}: {exc}"
    block_dim = executor.capabilities.kv_block_dim
    return KVBlocks(
        block_size, block_dim, tuple(tuple(layer) for layer in layers), tuple(seq.prompt_token_ids)
    ), None


def without_first_blocks(tensor: KVTensor, num_blocks: int, block_dim: int) -> KVTensor:
    """``tensor`` without its first ``num_blocks`` blocks along ``block_dim`` (those a prefix cache holds)."""
    if num_blocks == 0:
        return tensor
    shape = list(tensor.shape)
    outer = 1
    for n in shape[:block_dim]:
        outer *= n
    stride = tensor.num_bytes // (outer * shape[block_dim])  # bytes per block within one outer row
    view, row = memoryview(tensor.data).cast("B"), shape[block_dim] * stride
    data = b"".join(view[o * row + num_blocks * stride : (o + 1) * row] for o in range(outer))
    shape[block_dim] -= num_blocks
    return KVTensor(tensor.dtype, tuple(shape), data)


def kv_tensor_from_torch(tensor) -> KVTensor:
    """A CPU copy of ``tensor`` as a ``KVTensor`` (any dtype, bf16 included)."""
    import torch

    cpu = tensor.detach().to("cpu").contiguous()
    data = cpu.view(torch.uint8).numpy().tobytes() if cpu.numel() else b""
    return KVTensor(str(cpu.dtype).removeprefix("torch."), tuple(cpu.shape), data)


def kv_tensor_to_torch(kv: KVTensor):
    """The CPU torch tensor of ``kv`` (a copy; writable)."""
    import torch

    dtype = getattr(torch, kv.dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise KVTransferError(f"KV tensor of unknown dtype {kv.dtype!r}")
    raw = (
        torch.frombuffer(bytearray(kv.data), dtype=torch.uint8)
        if kv.num_bytes
        else torch.empty(0, dtype=torch.uint8)
    )
    return raw.view(dtype).reshape(kv.shape)
