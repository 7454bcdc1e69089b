"""Length-prefixed frames over a stream socket: 8 bytes (big-endian length), then the bytes.

Reads run against a deadline: a peer that stops sending fails the read with ``KVTransferError``
naming what was cut short, never a hang; a peer that closes mid-frame is named as gone.
"""

from __future__ import annotations

import socket
import struct
import time

from hetero_core.kv_transfer import KVTransferError

HEADER = struct.Struct(">Q")
MAX_FRAME_BYTES = 1 << 40


def send_frame(sock: socket.socket, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data).cast("B")
    sock.sendall(HEADER.pack(view.nbytes))
    if view.nbytes:
        sock.sendall(view)


def recv_frame(sock: socket.socket, deadline: float, peer: str, what: str) -> bytearray:
    """One frame's bytes, by ``deadline`` (``time.monotonic()``); ``what`` names it in errors."""
    (size,) = HEADER.unpack(_recv_exact(sock, HEADER.size, deadline, peer, what))
    if size > MAX_FRAME_BYTES:
        raise KVTransferError(f"{peer} sent a {what} frame of {size} bytes: not a hetero KV connector?")
    return _recv_exact(sock, size, deadline, peer, what)


def _recv_exact(sock: socket.socket, size: int, deadline: float, peer: str, what: str) -> bytearray:
    buffer = bytearray(size)
    view, done = memoryview(buffer), 0
    while done < size:
        left = deadline - time.monotonic()
        if left <= 0:
            raise KVTransferError(
                f"timed out waiting for the {what} from {peer} ({done} of {size} bytes came)"
            )
        sock.settimeout(left)
        try:
            n = sock.recv_into(view[done:], size - done)
        except TimeoutError:
            raise KVTransferError(
                f"timed out waiting for the {what} from {peer} ({done} of {size} bytes came)"
            ) from None
        except OSError as exc:
            raise KVTransferError(f"lost the connection to {peer} while reading the {what}: {exc}") from None
        if n == 0:
            raise KVTransferError(
                f"{peer} closed the connection after {done} of {size} bytes of the {what} "
                "(the peer engine stopped?)"
            )
        done += n
    return buffer
