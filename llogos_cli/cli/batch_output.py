"""`llogos batch` output: one JSON object per line, each written whole and flushed as it is ready.

Every line reaches the file in one write, so a run stopped by Ctrl-C or a kill leaves only
complete lines (at worst a torn last line, if the kill lands inside a write, which --resume cuts
off). --resume reads the ids already there and appends the rest; --ordered holds results back
until every earlier input line has its own.
"""

import json
import os
import sys
from pathlib import Path

from llogos_cli.errors import LlogosError


def done_ids(path: Path) -> set[str]:
    """The ids (JSON-spelled) of the complete lines of an output file; a torn last line is cut off
    the file so appending continues on a fresh line."""
    try:
        with open(path, "rb+") as f:
            data = f.read()
            end = data.rfind(b"\n") + 1
            if end < len(data):
                f.truncate(end)
    except FileNotFoundError:
        return set()
    except OSError as e:
        raise LlogosError(f"cannot read {path} to resume: {e.strerror}") from None
    ids = set()
    for line in data[:end].splitlines():
        try:
            ids.add(json.dumps(json.loads(line)["id"], sort_keys=True))
        except (ValueError, KeyError, TypeError):
            raise LlogosError(f"{path} has a line that is not a llogos batch result; not resuming into it") from None
    return ids


class Writer:
    """Writes results in finishing order, or with `ordered` in input order (by sequence number)."""

    def __init__(self, path: Path | None, append: bool, ordered: bool):
        if path is None:
            self._fd = sys.stdout.fileno()
            sys.stdout.flush()
        else:
            try:
                self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC), 0o644)
            except OSError as e:
                raise LlogosError(f"cannot write {path}: {e.strerror}") from None
        self._own = path is not None
        self._ordered = ordered
        self._held: dict[int, dict] = {}
        self._next = 0

    def write(self, number: int, record: dict) -> None:
        """Record for the input item with sequence number `number` (0, 1, 2, ... in input order)."""
        if not self._ordered:
            self._emit(record)
            return
        self._held[number] = record
        while self._next in self._held:
            self._emit(self._held.pop(self._next))
            self._next += 1

    def _emit(self, record: dict) -> None:
        data = (json.dumps(record, ensure_ascii=False) + "\n").encode()
        while data:
            data = data[os.write(self._fd, data):]

    def close(self) -> None:
        """Write what --ordered still holds (after an interruption: finished work is never lost)."""
        for number in sorted(self._held):
            self._emit(self._held.pop(number))
        if self._own:
            os.close(self._fd)
