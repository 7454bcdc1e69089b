"""The results file of a batch run: checked before the model loads, written one whole line at a time,
read back for ``--resume``.

Every problem with it (a directory, a missing folder, no permission, a full disk, something that is
not a file to resume from) is a ``HeteroError`` that names the path and what was kept: one line on
stderr, exit 2. A line goes out with as many writes as it takes; when one fails (or a second Ctrl-C
lands mid-line), the part of the line that reached the file is cut off again, so the file holds
only complete lines and ``--resume`` continues it.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from pathlib import Path
from typing import Any

from hetero_core.batch_files.input_file import id_key
from hetero_core.batch_files.json_lines import LineError, decode_line, encode_line
from hetero_core.errors import HeteroError

STDOUT = "-"


def check_output(path: str) -> None:
    """Refuse, before the model loads, an output that cannot be written: a directory, a missing
    folder, a file or folder without write permission."""
    if path == STDOUT:
        return
    if os.path.isdir(path):
        raise HeteroError(f"cannot write --output {path}: it is a directory; give a file name")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise HeteroError(f"cannot write --output {path}: there is no folder {folder}")
    if not os.access(path if os.path.exists(path) else folder, os.W_OK):
        raise HeteroError(f"cannot write --output {path}: permission denied")


class ResultWriter:
    """Writes records as JSON lines to ``path`` (``-``: stdout), appending or from scratch."""

    def __init__(self, path: str, *, append: bool) -> None:
        self.path, self.num_lines, self._fd = path, 0, None
        if path == STDOUT:
            return
        flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
        try:
            self._fd = os.open(path, flags, 0o666)
            self._end = os.lseek(self._fd, 0, os.SEEK_END)
        except OSError as exc:
            self.close()
            raise HeteroError(f"cannot write --output {path}: {exc.strerror}") from None

    def __enter__(self) -> ResultWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def write(self, record: Any) -> None:
        data = encode_line(record)
        try:
            self._write_stdout(data) if self._fd is None else self._write_file(data)
        except BrokenPipeError:
            raise  # stdout's reader left (``| head``): the CLI stops quietly
        except OSError as exc:
            raise HeteroError(self._failure(exc.strerror or str(exc))) from None
        self.num_lines += 1

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def _write_file(self, data: bytes) -> None:
        view, written = memoryview(data), 0
        try:
            while written < len(data):
                count = os.write(self._fd, view[written:])
                if count == 0:
                    raise OSError(errno.EIO, "the file took no more bytes")
                written += count
        except BaseException:
            if written:
                self._cut_back()
            raise
        self._end += len(data)

    def _cut_back(self) -> None:
        try:
            os.ftruncate(self._fd, self._end)
        except OSError:  # not a regular file (/dev/full), or refused: --resume drops a cut-off last line
            pass

    @staticmethod
    def _write_stdout(data: bytes) -> None:
        sys.stdout.flush()
        out = getattr(sys.stdout, "buffer", None)
        if out is None:
            sys.stdout.write(data.decode("utf-8"))
            sys.stdout.flush()
        else:
            out.write(data)
            out.flush()

    def _failure(self, reason: str) -> str:
        kept = f"after {self.num_lines} complete result line(s)"
        if self._fd is None:
            return f"cannot write the results to stdout: {reason} ({kept})"
        return (
            f"cannot write --output {self.path}: {reason} ({kept}; once that is fixed, run again "
            "with --resume to finish)"
        )


def resume_output(path: str) -> set[str]:
    """The id keys of the results ``path`` holds (none if it does not exist), the file made ready to
    append to: a last line cut short (a run killed mid-write) is removed, and so are the error rows
    of malformed lines (they carry ``line``): those lines are read again, run if now fixed."""
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise HeteroError(
                f"cannot resume from --output {path}: not a regular file "
                "(--resume reads back the results file of an earlier run)"
            )
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return set()
    except OSError as exc:
        raise HeteroError(f"cannot resume from --output {path}: {exc.strerror}") from None
    done, kept, end, dropped = set(), [], 0, False
    for raw in data.splitlines(keepends=True):
        try:
            record = decode_line(raw)
        except LineError as exc:
            if raw.endswith(b"\n"):
                raise HeteroError(
                    f"cannot resume: {path} holds a line that is not a result at byte {end} "
                    f"({exc}); is it a results file?"
                ) from None
            break  # the cut-off last line
        if not isinstance(record, dict) or not ("custom_id" in record or "id" in record):
            raise HeteroError(f"cannot resume: {path} holds a line without 'id' or 'custom_id' at byte {end}")
        end += len(raw)
        if "line" in record:
            dropped = True
            continue
        done.add(id_key(record["custom_id"] if "custom_id" in record else record["id"]))
        kept.append(raw if raw.endswith(b"\n") else raw + b"\n")
    _keep_only(path, data, kept if dropped else None, end)
    return done


def _keep_only(path: str, data: bytes, kept: list[bytes] | None, end: int) -> None:
    """Leave ``path`` holding its complete lines (the first ``end`` bytes of ``data``), or just the
    ``kept`` ones when some are to go."""
    try:
        if kept is not None:  # error rows to drop: write the file anew, whole or not at all
            from hetero_core.cache.atomic_file import replaced_atomically  # sets OpenMP's policy on import

            target = Path(os.path.realpath(path))
            with replaced_atomically(target, ".resume") as tmp:
                Path(tmp).write_bytes(b"".join(kept))
                os.chmod(tmp, stat.S_IMODE(os.stat(target).st_mode))
        elif end < len(data):
            with open(path, "r+b") as f:
                f.truncate(end)
        elif data and not data.endswith(b"\n"):
            with open(path, "ab") as f:
                f.write(b"\n")
    except OSError as exc:
        raise HeteroError(f"cannot resume from --output {path}: {exc.strerror}") from None
