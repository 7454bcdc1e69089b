"""The Ray actor one worker rank runs in (the ``ray`` backend, started by ``ray_launcher.py``).

It connects back to rank 0 at the address it is given (rank 0's node, a port rank 0's OS picked),
proves itself with the launch's token, says who it is (rank, pid, node), then runs the very loop a
local worker process runs (``worker.run``) over that connection: the setup, the factory, the process
group, then rank 0's commands until shutdown. Like a local worker it exits the moment rank 0's end
closes, and after reporting a failure it exits at once (Ray then reports the actor dead).
"""

from __future__ import annotations

import os
import socket
from multiprocessing.connection import Connection

import ray

from hetero_core.distributed import worker
from hetero_core.distributed.node_interface import pin_gloo_interface

CONNECT_TIMEOUT_S = 30.0  # reaching rank 0's port (a firewall that drops packets would hang the actor)


@ray.remote(max_restarts=0)  # a rank that dies stays dead: its group cannot go on without it
class RankActor:
    def run(self, rank: int, address: tuple[str, int], token: bytes) -> None:
        node_ip = ray.util.get_node_ip_address()
        connection = socket.create_connection(address, timeout=CONNECT_TIMEOUT_S)
        connection.settimeout(None)
        conn = Connection(connection.detach())
        conn.send_bytes(token)
        conn.send((rank, os.getpid(), ray.get_runtime_context().get_node_id(), node_ip))
        pin_gloo_interface(node_ip)
        worker.run(conn, own_sys_path=True)
