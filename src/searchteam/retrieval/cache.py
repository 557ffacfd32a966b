"""Atomic on-disk index folders: built in a temporary folder beside the target, then renamed into place."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from searchteam.cache import cache_dir
from searchteam.files import atomic_dir

COMPLETE_MARKER = "COMPLETE"


def index_dir(name: str) -> Path:
    """Where an index called `name` lives (not created: its presence means it is complete)."""
    return cache_dir("indexes") / name


def is_complete(path: Path) -> bool:
    return (path / COMPLETE_MARKER).is_file()


def build_atomically(target: Path, write: Callable[[Path], None]) -> None:
    """Run `write(folder)` into a fresh folder that becomes `target`, marked complete, in one rename
    (`atomic_dir`). Readers never see a half-written index; if another process finished the same index
    first, its copy wins and ours is discarded."""
    with atomic_dir(target, keep=is_complete) as folder:
        folder.chmod(0o755)  # mkdtemp makes it owner-only; an index is as shareable as the cache folder
        write(folder)
        (folder / COMPLETE_MARKER).write_text("ok\n", encoding="utf-8")
