"""`llogos batch` output: one JSON object per line, each written whole and flushed as it is ready.

Every line reaches the file in one write, so a run stopped by Ctrl-C or a kill leaves only
complete lines (at worst a torn last line, if the kill lands inside a write, which --resume cuts
off). --resume reads the ids that already have results and appends the rest, the lines that
failed included: their error lines are taken out of the file first, so it still holds one line
per input line. --ordered holds results back until every earlier input line has its own.

A run across a Ray cluster writes a directory instead, each run into a part-NNNNN.jsonl of its
own, and --resume reads them all.
"""

import itertools
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from llogos_cli.jobs.lines import Done
from llogos_cli.errors import LlogosError


@dataclass(frozen=True, slots=True)
class Output:
    """-o, and what to do with the results it already holds."""
    path: Path | None          # None: stdout
    resume: bool = False       # keep them and run the rest
    overwrite: bool = False    # replace them
    ordered: bool = False      # write results in input order


def file_done(path: Path) -> Done:
    """The ids an output file holds results for. Its error lines are taken out, to be run again (the
    input line may have been fixed, or -c raised, since), and a torn last line is cut off so that
    appending continues on a fresh line."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return Done()
    except OSError as e:
        raise LlogosError(f"cannot read {path} to resume: {e.strerror}") from None
    end = data.rfind(b"\n") + 1
    ids, kept, failed = set(), [], 0
    for line in data[:end].splitlines(keepends=True):
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or "id" not in record:
                raise ValueError
        except ValueError:
            raise LlogosError(f"{path} has a line that is not a llogos batch result; not resuming into it") from None
        if "error" in record:
            failed += 1
        else:
            ids.add(json.dumps(record["id"], sort_keys=True))
            kept.append(line)
    try:
        if failed:
            _replace(path, b"".join(kept))
        elif end < len(data):
            os.truncate(path, end)
    except OSError as e:
        raise LlogosError(f"cannot update {path} to resume: {e.strerror}") from None
    return Done(frozenset(ids), failed)


def _replace(path: Path, data: bytes) -> None:
    """Give the file new contents through a renamed copy, so that a kill never leaves it half written."""
    temporary = path.with_name(path.name + ".resuming")
    temporary.write_bytes(data)
    os.replace(temporary, path)


def parts(folder: Path) -> list[Path]:
    """The result files of an output directory, oldest first."""
    return sorted(folder.glob("part-*.jsonl"))


def folder_done(folder: Path) -> Done:
    done = [file_done(p) for p in parts(folder)]
    return Done(frozenset().union(*(d.ids for d in done)), sum(d.failed for d in done))


def new_part(folder: Path) -> Path:
    """The next unused part file of an output directory (made if missing)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LlogosError(f"cannot make the output directory {folder}: {e.strerror}") from None
    return next(path for n in itertools.count() if not (path := folder / f"part-{n:05d}.jsonl").exists())


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
