"""Files that a killed writer cannot leave torn: a text file or a folder put in place in one rename, JSONL
read back as far as its last whole line; and the one-line message for a disk that cannot be written."""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from searchteam.errors import JsonlError


def temp_entry(target: Path) -> Path:
    """A fresh temporary folder beside `target`, named so that `sweep_temp_entries` finds it."""
    return Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))


def filesystem_fault(exc: OSError) -> str | None:
    """A one-line message for a full disk or a folder that cannot be written; None for other OSErrors."""
    where = f" {exc.filename}" if exc.filename else ""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return (
            f"no space left on the device to write{where}: free some disk space, or write elsewhere "
            "(--out for run outputs, $SEARCHTEAM_CACHE for converted models and indexes)"
        )
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return (
            f"cannot write{where} ({exc.strerror}): choose a writable --out, or set $SEARCHTEAM_CACHE to a "
            "writable folder for converted models and indexes"
        )
    return None


def write_lines_atomic(path: Path, lines: Iterable[str]) -> None:
    """Write a text file in one step: the lines go to a temporary file beside it, then `os.replace` puts
    it in place, so a reader sees the old file or the whole new one, never a torn one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    with tmp.open("w", encoding="utf-8") as fh:
        fh.writelines(lines)
    os.replace(tmp, path)


@contextmanager
def atomic_dir(target: Path, keep: Callable[[Path], bool] | None = None) -> Iterator[Path]:
    """A fresh hidden folder beside `target` (`temp_entry`) for the block to fill; when the block ends
    without an error, the folder takes `target`'s place in one rename (a folder already there is moved
    aside and deleted), else it is deleted. Readers see the old folder or the whole new one; a killed
    writer leaves only a hidden `.NAME.tmp-*` folder, which `sweep_temp_entries` recognizes. With `keep`,
    a folder already at `target` that `keep` accepts (another process finished first) stays, and the new
    one is dropped."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_entry(target)
    try:
        yield tmp
        _move_into_place(tmp, target, keep)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _move_into_place(folder: Path, target: Path, keep: Callable[[Path], bool] | None) -> None:
    aside = None
    if target.exists():
        if keep is not None and keep(target):
            return
        aside = temp_entry(target)
        os.replace(target, aside)  # onto the empty folder `temp_entry` made
    try:
        os.replace(folder, target)
    except OSError:
        if keep is None or not target.exists() or not keep(target):
            raise
    finally:
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)


def read_jsonl_numbered(path: Path, *, repair: bool = False) -> list[tuple[int, Any]]:
    """The records of a JSONL file that a process appends to, or was killed appending to, each with its
    1-based line number. A last line that is not whole JSON (torn mid-write) is left out; with `repair`
    the file is cut back to its whole lines, ending in a newline, so that the next append starts a
    line of its own. Blank lines are skipped; any other line that does not parse raises `JsonlError`."""
    lines = path.read_bytes().splitlines(keepends=True)
    records: list[tuple[int, Any]] = []
    whole = 0  # how many lines are whole
    for number, line in enumerate(lines, 1):
        if line.strip():
            try:
                records.append((number, json.loads(line)))
            except ValueError:  # JSONDecodeError, or UTF-8 cut inside a character
                if any(rest.strip() for rest in lines[number:]):
                    raise JsonlError(f"{path}:{number}: not a JSON line") from None
                break
        whole = number
    if repair and (whole < len(lines) or (lines and not lines[-1].endswith(b"\n"))):
        with path.open("r+b") as fh:
            fh.truncate(sum(len(line) for line in lines[:whole]))
            if whole and not lines[whole - 1].endswith(b"\n"):
                fh.seek(0, os.SEEK_END)
                fh.write(b"\n")
    return records


def read_jsonl_tolerant(path: Path, *, repair: bool = False) -> list[Any]:
    """`read_jsonl_numbered` without the line numbers."""
    return [record for _, record in read_jsonl_numbered(path, repair=repair)]
