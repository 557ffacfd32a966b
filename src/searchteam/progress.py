"""The one progress bar style of long loops (episodes of a run, optimizer steps of a warm start)."""

from __future__ import annotations

from datetime import timedelta

from rich import get_console
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text


def progress_bar(
    enabled: bool, label: str = "[bold]{task.description}", console: Console | None = None
) -> Progress:
    """Count, elapsed and remaining time after `label` (a rich format of the task); nothing when disabled.
    Where the console is not a terminal (a run writing to a log file), rich draws the bar only when it
    stops, so a plain line is printed each time a task passes another tenth of its total instead."""
    columns = (
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    console = console or get_console()
    if console.is_terminal:
        return Progress(*columns, console=console, disable=not enabled)
    return TenthsProgress(*columns, label=label, console=console, disable=not enabled)


def _duration(seconds: float) -> str:
    return str(timedelta(seconds=int(seconds)))


class TenthsProgress(Progress):
    """A progress bar for log files: one line per tenth of a task done, with the elapsed time and the time
    left at the mean pace so far (rich's estimate follows the last 30 s, and batched episodes finish in
    bursts)."""

    def __init__(self, *columns, label: str, **kwargs) -> None:
        super().__init__(*columns, **kwargs)
        self._label = label
        self._tenths_logged: dict[TaskID, int] = {}

    def advance(self, task_id: TaskID, advance: float = 1) -> None:
        super().advance(task_id, advance)
        self._log_tenth(task_id)

    def _log_tenth(self, task_id: TaskID) -> None:
        task = next(t for t in self.tasks if t.id == task_id)
        if self.disable or not task.total:
            return
        tenths = int(10 * task.completed / task.total)
        if tenths <= self._tenths_logged.get(task_id, 0) or task.finished:  # rich prints the finished bar
            return
        self._tenths_logged[task_id] = tenths
        label = Text.from_markup(self._label.format(task=task)).plain
        elapsed = task.elapsed or 0.0
        remaining = elapsed * (task.total - task.completed) / task.completed  # the mean pace so far
        self.console.print(
            f"{label} {task.completed:g}/{task.total:g} after {_duration(elapsed)}, "
            f"about {_duration(remaining)} left",
            highlight=False,
            markup=False,
        )
