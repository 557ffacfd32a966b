"""The one progress bar style of long loops (episodes of a run, optimizer steps of a warm start)."""

from __future__ import annotations

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


def progress_bar(enabled: bool, label: str = "[bold]{task.description}") -> Progress:
    """Count, elapsed and remaining time after `label` (a rich format of the task); nothing when disabled."""
    return Progress(
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        disable=not enabled,
    )
