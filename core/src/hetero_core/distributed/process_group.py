"""The process group of a tensor-parallel engine: gloo for CPU tensors, NCCL for CUDA tensors.

Rank 0 hosts the rendezvous store on a port the OS picks (no race for a "free" port), the workers
connect to it: on the loopback address when they are local processes, on rank 0's node address when
they run on other machines (Ray actors). Every collective gets a timeout, so a rank that stops
answering (stopped, not killed: a killed rank closes its sockets and its peers fail at once) fails
the step, never hangs it.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

HOST = "127.0.0.1"
COLLECTIVE_TIMEOUT = timedelta(seconds=120)  # a collective waiting for a peer; also each reply per step
START_TIMEOUT = timedelta(seconds=600)  # spawning, importing torch and loading a shard, per rank


def backend() -> str:
    """gloo on CPU; with CUDA and NCCL available, NCCL for CUDA tensors (gloo still for CPU ones)."""
    if torch.cuda.is_available() and dist.is_nccl_available():
        return "cpu:gloo,cuda:nccl"
    return "gloo"


def host_store(world_size: int, host: str = HOST) -> dist.TCPStore:
    """Rank 0's rendezvous store at ``host``, on a port the OS picks (``store.port``)."""
    return dist.TCPStore(host, 0, world_size, is_master=True, timeout=START_TIMEOUT, wait_for_workers=False)


def join_store(host: str, port: int, world_size: int) -> dist.TCPStore:
    return dist.TCPStore(host, port, world_size, is_master=False, timeout=START_TIMEOUT)


def init_group(store: dist.TCPStore, rank: int, world_size: int, backend_name: str) -> None:
    """Join the default process group (blocks until every rank has joined)."""
    dist.init_process_group(
        backend_name, store=store, rank=rank, world_size=world_size, timeout=COLLECTIVE_TIMEOUT
    )


def destroy_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
