"""Where searchteam caches converted models and retrieval indexes, and how a cache entry stays whole.

An entry is a folder, built in a temporary folder beside it and renamed into place, so a build that is killed
leaves no entry, only a hidden temporary folder that the next build of that entry deletes. Before the rename,
the build writes `MANIFEST.json`: each file's size, mtime and sha256. A later run checks sizes and mtimes
(cheap) and re-hashes only the files whose mtime changed. An entry that fails the check, or fails to load, is
moved aside and rebuilt with a one-line warning. A lock file (in `locks/` under the cache root) serializes
the builds of an entry across processes, so two processes converting the same model end with one valid
entry, converted once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from searchteam.files import write_lines_atomic

log = logging.getLogger(__name__)

MANIFEST = "MANIFEST.json"
MANIFEST_FORMAT = 1
MISSING = "missing"
# a failure of these kinds, loading an entry that was not just built, means the entry is damaged
LOAD_ERRORS: tuple[type[Exception], ...] = (OSError, ValueError, KeyError, IndexError, EOFError, RuntimeError)

Check = Callable[[Path], str | None]


def cache_dir(*parts: str) -> Path:
    """`$SEARCHTEAM_CACHE` or `~/.cache/searchteam`, plus sub-folders (created on demand)."""
    root = Path(os.environ.get("SEARCHTEAM_CACHE") or Path.home() / ".cache" / "searchteam")
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def file_sha256(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def write_manifest(folder: Path) -> None:
    """Record every file under `folder` (size, mtime, sha256). A build calls it last, before its rename."""
    files = {
        p.relative_to(folder).as_posix(): _file_record(p)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }
    _write_manifest_file(folder, files)


def manifest_problem(folder: Path) -> str | None:
    """None when every file of the folder's manifest is as it was built, else what differs. Files whose size
    and mtime match are trusted; the others are re-hashed, and a new mtime with the same content recorded."""
    files = _read_manifest(folder)
    if files is None:
        return f"its {MANIFEST} is missing or unreadable"
    touched = []
    for name, want in files.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        stat = path.stat()
        if stat.st_size != want["size"]:
            return f"{name} has {stat.st_size:,} bytes instead of {want['size']:,}"
        if stat.st_mtime_ns != want["mtime_ns"]:
            touched.append(name)
    for name in touched:
        digest = file_sha256(folder / name)
        if digest != files[name]["sha256"]:
            return f"{name} is not the file that was built (sha256 differs)"
        files[name] = _file_record(folder / name, digest)
    if touched:
        _try(lambda: _write_manifest_file(folder, files))
    return None


def require_files(*names: str) -> Check:
    """A check that an entry holds these files (for entries written before manifests existed)."""

    def check(folder: Path) -> str | None:
        missing = [n for n in names if not (folder / n).is_file()]
        return f"{', '.join(missing)} missing" if missing else None

    return check


def entry_problem(target: Path, check: Check) -> str | None:
    """None when `target` is a whole entry, MISSING when there is none, else what is wrong with it. An entry
    without a manifest (built before manifests existed) is adopted when `check` finds it sound."""
    if not target.is_dir():
        return MISSING
    if _read_manifest(target) is not None:
        return manifest_problem(target)
    problem = check(target)
    if problem is None and os.access(target, os.W_OK):
        _try(lambda: write_manifest(target))
    return problem


def ensure_cache(
    target: Path,
    build: Callable[[], None],
    what: str,
    check: Check | None = None,
    load: Callable[[], None] | None = None,
) -> bool:
    """Make `target` a whole cache entry and return whether it was (re)built.

    Under the entry's lock: an entry without a manifest is adopted when `check` (default: none) finds it
    sound; a damaged entry is discarded with a one-line warning, and a missing one is built by `build()`,
    which writes the manifest last and renames the entry into place. `load`, if given, runs under the lock
    too; when it fails with one of LOAD_ERRORS on an entry that was not just built, the entry is rebuilt once
    and loaded again."""
    check = check or require_files()
    with cache_lock(target):
        built = _build_if_needed(target, build, what, check)
        if load is None:
            return built
        try:
            load()
        except LOAD_ERRORS as exc:
            if built:
                raise
            discard(target, what, f"it cannot be loaded: {type(exc).__name__}: {exc}")
            _build_if_needed(target, build, what, check)
            load()
            built = True
        return built


def discard(target: Path, what: str, problem: str) -> None:
    """Warn in one line, move the damaged entry aside (one atomic step) and delete it."""
    problem = " ".join(problem.split())[:300]
    log.warning("searchteam: cached %s at %s is damaged (%s); rebuilding it", what, target, problem)
    aside = target.with_name(f".{target.name}.damaged-{os.getpid()}")
    shutil.rmtree(aside, ignore_errors=True)
    os.replace(target, aside)
    shutil.rmtree(aside, ignore_errors=True)


def sweep_temp_entries(target: Path) -> None:
    """Delete what killed builds of `target` left behind: hidden `.NAME.xxxxxxxx`, `.NAME.tmp-xxxxxxxx` and
    `.NAME.damaged-PID` folders (and the `.NAME-xxxxxxxx` of older versions). Call it holding the lock."""
    pattern = re.compile(rf"\.{re.escape(target.name)}[.-](?:tmp-|damaged-)?[a-z0-9_]+")
    for path in target.parent.iterdir():
        if pattern.fullmatch(path.name) and path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)


@contextmanager
def cache_lock(target: Path) -> Iterator[None]:
    """Hold the lock of `target` (`ROOT/locks/KIND.NAME.lock` for the entry `ROOT/KIND/NAME`); the OS frees it
    when its process dies. Where the lock cannot be created (a read-only cache), none is taken: nothing can
    be built there anyway."""
    from filelock import FileLock, Timeout

    try:
        locks = target.parent.parent / "locks"
        locks.mkdir(exist_ok=True)
        lock = FileLock(locks / f"{target.parent.name}.{target.name}.lock")
        lock.acquire(timeout=0)
    except Timeout:
        log.warning("searchteam: waiting for another process that is building %s", target)
        lock.acquire()
    except OSError:
        yield
        return
    try:
        yield
    finally:
        lock.release()


def _build_if_needed(target: Path, build: Callable[[], None], what: str, check: Check) -> bool:
    problem = entry_problem(target, check)
    if problem is None:
        return False
    if problem != MISSING:
        discard(target, what, problem)
    sweep_temp_entries(target)
    build()
    return True


def _file_record(path: Path, digest: str | None = None) -> dict[str, Any]:
    stat = path.stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": digest or file_sha256(path)}


def _read_manifest(folder: Path) -> dict[str, dict[str, Any]] | None:
    """The manifest's file records, or None when it is missing or not one this version wrote."""
    try:
        data = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        files = data["files"]
        valid = data["format"] == MANIFEST_FORMAT and all(
            isinstance(r["size"], int) and isinstance(r["mtime_ns"], int) and isinstance(r["sha256"], str)
            for r in files.values()
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return files if valid else None


def _write_manifest_file(folder: Path, files: dict[str, dict[str, Any]]) -> None:
    write_lines_atomic(folder / MANIFEST, [json.dumps({"format": MANIFEST_FORMAT, "files": files}, indent=1)])


def _try(action: Callable[[], None]) -> None:
    """Best effort: a cache folder that cannot be written keeps working as it did."""
    try:
        action()
    except OSError as exc:
        log.debug("searchteam: cannot update a cache manifest: %s", exc)
