import io

from rich.console import Console

from searchteam.progress import TenthsProgress, progress_bar


def test_a_log_file_gets_one_line_per_tenth_of_a_task():
    out = io.StringIO()  # not a terminal, like a run's output redirected to a file
    console = Console(file=out, width=200)
    with progress_bar(True, "[bold]{task.description}: fine-tune", console=console) as bar:
        assert isinstance(bar, TenthsProgress)
        task = bar.add_task("round 1", total=20)
        for _ in range(20):
            bar.advance(task)
    lines = out.getvalue().splitlines()
    counts = [line.split(" after")[0] for line in lines[:9]]
    assert counts == [f"round 1: fine-tune {n}/20" for n in range(2, 20, 2)]
    assert "left" in lines[0] and "20/20" in lines[9] and len(lines) == 10  # rich's own final bar


def test_a_disabled_bar_prints_nothing():
    out = io.StringIO()
    with progress_bar(False, console=Console(file=out)) as bar:
        bar.advance(bar.add_task("x", total=4), 4)
    assert out.getvalue() == ""
