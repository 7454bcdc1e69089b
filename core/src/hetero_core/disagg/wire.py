"""What the front end and the role servers exchange: pickled objects in length-prefixed frames (a
request body is one frame; a decode stream is one frame per ``RequestDelta``). Errors travel as
``RemoteError`` (the exception's class name and message) and are raised again as the engine's own
errors, so a 400 stays a 400. Pickles: the role servers listen on loopback by default; never expose
them to an untrusted network."""

from __future__ import annotations

import pickle
import struct
from dataclasses import dataclass

from hetero_core.async_llm.errors import EngineDeadError, EngineOverloadedError, RequestFailedError
from hetero_core.errors import InvalidRequestError

HEADER = struct.Struct(">Q")
CONTENT_TYPE = "application/x-hetero-frames"
_RAISED_AS = {cls.__name__: cls for cls in (InvalidRequestError, RequestFailedError, EngineOverloadedError)}


class RoleLostError(EngineDeadError):
    """A role process (prefill or decode) stopped, or cannot be reached, while serving a request."""


@dataclass(frozen=True)
class RemoteError:
    kind: str  # the exception's class name
    message: str

    @classmethod
    def of(cls, exc: BaseException) -> RemoteError:
        return cls(type(exc).__name__, str(exc))

    def exception(self, role: str) -> Exception:
        """The error to raise in the front end: the engine's own for a bad request or an overload,
        else ``RoleLostError`` naming the role."""
        if self.kind in _RAISED_AS:
            return _RAISED_AS[self.kind](self.message)
        return RoleLostError(f"the {role} engine failed the request: {self.kind}: {self.message}")


def frame(obj) -> bytes:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(data)) + data


def loads(data: bytes):
    """The object of one whole frame (a request or response body)."""
    (size,) = HEADER.unpack_from(data)
    if len(data) != HEADER.size + size:
        raise ValueError(
            f"a frame of {len(data)} bytes announces {size} + {HEADER.size}: cut short or not a frame"
        )
    return pickle.loads(data[HEADER.size :])


class FrameReader:
    """Feed bytes as they arrive; ``frames()`` yields each complete object."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def feed(self, chunk: bytes) -> list:
        self.buffer += chunk
        objects = []
        while len(self.buffer) >= HEADER.size:
            (size,) = HEADER.unpack_from(self.buffer)
            if len(self.buffer) < HEADER.size + size:
                break
            objects.append(pickle.loads(bytes(self.buffer[HEADER.size : HEADER.size + size])))
            del self.buffer[: HEADER.size + size]
        return objects

    @property
    def has_partial(self) -> bool:
        return bool(self.buffer)
