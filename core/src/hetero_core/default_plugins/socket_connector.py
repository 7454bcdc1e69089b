"""The built-in KV connector ``socket``: published blocks are served over a TCP socket on the
publishing engine's machine (a thread accepts fetches); a fetch is one connection: the transfer id
goes out, a JSON header and one frame per tensor come back (``socket_frames``).

Pull, not push: the prefill engine keeps a transfer until it is fetched once, discarded, or older
than ``ttl_s`` (a decode engine that died never fetches it). Options: ``[kv_connector.socket]``.
"""

from __future__ import annotations

import json
import socket
import threading
import time

from pydantic import BaseModel, ConfigDict, Field

from hetero_core.default_plugins.socket_frames import recv_frame, send_frame
from hetero_core.kv_transfer import KVBlocks, KVConnectorContext, KVTensor, KVTransferError
from hetero_core.logging import get_logger

log = get_logger("hetero.kv_transfer")


class SocketConnectorOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = Field("127.0.0.1", description="address the publishing engine serves its KV blocks on")
    port: int = Field(0, ge=0, le=65535, description="port for them (0: pick a free one)")
    advertise_host: str | None = Field(
        None,
        min_length=1,
        description="the host decode engines fetch from (default: "
        "host; this machine's name when host is 0.0.0.0 or ::)",
    )
    ttl_s: float = Field(120.0, gt=0, description="drop a published transfer nobody fetched after this long")


class SocketConnector:
    def __init__(self, options: SocketConnectorOptions | None = None) -> None:
        self.options = options or SocketConnectorOptions()
        self._store: dict[str, tuple[KVBlocks, float]] = {}
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._address: str | None = None
        self._closed = False

    @property
    def num_published(self) -> int:
        with self._lock:
            return len(self._store)

    def publish(self, transfer_id: str, blocks: KVBlocks) -> str:
        address = self._serve()
        now = time.monotonic()
        with self._lock:
            expired = [tid for tid, (_, at) in self._store.items() if now - at > self.options.ttl_s]
            for tid in expired:
                del self._store[tid]
            self._store[transfer_id] = (blocks, now)
        if expired:
            log.warning("kv_transfer.expired", num_transfers=len(expired), ttl_s=self.options.ttl_s)
        return address

    def discard(self, transfer_id: str) -> None:
        with self._lock:
            self._store.pop(transfer_id, None)

    def fetch(self, address: str, transfer_id: str, timeout: float) -> KVBlocks:
        deadline = time.monotonic() + timeout
        peer = f"the KV connector at {address}"
        host, _, port = address.rpartition(":")
        try:
            sock = socket.create_connection((host, int(port)), timeout=max(timeout, 0.001))
        except (OSError, ValueError) as exc:
            raise KVTransferError(f"cannot reach {peer}: {exc}; is the prefill engine running?") from None
        with sock:
            try:
                send_frame(sock, transfer_id.encode())
            except OSError as exc:
                raise KVTransferError(f"lost the connection to {peer}: {exc}") from None
            header = json.loads(recv_frame(sock, deadline, peer, "header"))
            if "error" in header:
                raise KVTransferError(f"{peer} refused transfer {transfer_id!r}: {header['error']}")
            layers = tuple(
                tuple(
                    KVTensor(
                        t["dtype"], tuple(t["shape"]), recv_frame(sock, deadline, peer, f"layer {i} tensor")
                    )
                    for t in layer
                )
                for i, layer in enumerate(header["layers"])
            )
        return KVBlocks(header["block_size"], header["block_dim"], layers, tuple(header["token_ids"]))

    def close(self) -> None:
        self._closed = True
        with self._lock:
            self._store.clear()
            listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()

    # -- serving ----------------------------------------------------------------------------------
    def _serve(self) -> str:
        with self._lock:
            if self._closed:
                raise KVTransferError("the socket KV connector is closed")
            if self._listener is None:
                listener = socket.create_server((self.options.host, self.options.port))
                host, port = listener.getsockname()[:2]
                host = self.options.advertise_host or (
                    socket.getfqdn() if host in ("0.0.0.0", "::") else host
                )
                self._listener, self._address = listener, f"{host}:{port}"
                threading.Thread(
                    target=self._accept, args=(listener,), name="hetero-kv-connector", daemon=True
                ).start()
            return self._address

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._send, args=(conn,), daemon=True).start()

    def _send(self, conn: socket.socket) -> None:
        with conn:
            try:
                transfer_id = recv_frame(
                    conn, time.monotonic() + 30.0, "a fetching engine", "transfer id"
                ).decode()
                with self._lock:
                    entry = self._store.pop(transfer_id, None)
                if entry is None:
                    send_frame(
                        conn,
                        json.dumps(
                            {
                                "error": "unknown transfer id (never published, already "
                                "fetched, discarded or expired)"
                            }
                        ).encode(),
                    )
                    return
                blocks = entry[0]
                header = {
                    "block_size": blocks.block_size,
                    "block_dim": blocks.block_dim,
                    "token_ids": list(blocks.token_ids),
                    "layers": [
                        [{"dtype": t.dtype, "shape": list(t.shape)} for t in layer] for layer in blocks.layers
                    ],
                }
                conn.settimeout(30.0)
                send_frame(conn, json.dumps(header).encode())
                for layer in blocks.layers:
                    for tensor in layer:
                        send_frame(conn, tensor.data)
            except (OSError, KVTransferError) as exc:  # the fetcher went away: its fetch fails there
                log.warning("kv_transfer.send_failed", error=str(exc))


def create_socket_connector(ctx: KVConnectorContext) -> SocketConnector:
    return SocketConnector(ctx.options)
