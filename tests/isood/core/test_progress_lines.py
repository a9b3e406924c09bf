"""Progress and tables in logs: when stderr is not a terminal, progress is written as plain lines (start, at most one
per interval, end) instead of a rich bar that draws nothing until the end; tables printed to a pipe keep their
natural width instead of rich's 80 columns."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from isood.core.progress import LineProgress, is_progress_line, progress_bar, track

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _log_console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=False, width=80), buf


def test_a_bar_on_a_pipe_writes_lines_at_start_per_interval_and_at_the_end():
    console, buf = _log_console()
    clock = _Clock()
    bar = LineProgress(console, rate_unit="images", interval=10.0, clock=clock)
    with bar:
        task = bar.add_task("scoring id_test", total=100, rate=0.0)
        for i in range(100):
            clock.now += 0.5  # 50 s in all: lines at 10, 20, 30, 40 s and at the end
            bar.update(task, advance=1, rate=2.0)
    lines = buf.getvalue().splitlines()
    assert lines[0] == "scoring id_test: 0/100 (0%), 0:00 elapsed"
    assert lines[-1] == "scoring id_test: 100/100 (100%), 0:50 elapsed, 2.00 images/s"
    assert [line.split(": ")[1].split(" ")[0] for line in lines[1:-1]] == ["20/100", "40/100", "60/100", "80/100"]
    assert all(is_progress_line(line) for line in lines)
    assert not is_progress_line("error: --out: cannot use out/x: 3/4 (75%), 0:01 elapsed; pass another --out")


def test_a_task_without_total_ends_with_a_line_on_exit():
    console, buf = _log_console()
    with LineProgress(console, interval=1e9) as bar:
        task = bar.add_task("reading", total=None)
        bar.advance(task, 7)
    assert buf.getvalue().splitlines() == ["reading: 0, 0:00 elapsed", "reading: 7, 0:00 elapsed"]


def test_progress_bar_picks_lines_off_a_terminal_and_nothing_when_disabled():
    console, buf = _log_console()
    assert isinstance(progress_bar(True, console=console), LineProgress)
    with progress_bar(False, console=console) as bar:
        bar.advance(bar.add_task("x", total=3), 3)
    assert buf.getvalue() == ""


def test_track_on_a_pipe_starts_without_a_blank_line():
    code = "from isood.core.progress import track\nfor _ in track(range(5), 5, 'scoring'): pass\nprint('done')"
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | {"PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert r.stderr.splitlines() == ["scoring: 0/5 (0%), 0:00 elapsed", "scoring: 5/5 (100%), 0:00 elapsed"]


def test_tables_keep_their_width_on_a_pipe():
    code = ("from rich.table import Table\nfrom isood.cli._app import out_console\n"
            "t = Table()\n"
            "for name in ['detector', 'AUROC', 'FPR@95 (OpenOOD)', 'AUPR-In', 'AUPR-Out', 'AUTC', 'DER95', "
            "'correlation', 'sensitivity', 'cells measured']: t.add_column(name)\n"
            "t.add_row('knn:k=50,normalize=true', *['0.123456'] * 9)\nout_console.print(t)")
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | {"PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert "…" not in r.stdout
    assert "knn:k=50,normalize=true" in r.stdout and "cells measured" in r.stdout
    assert max(len(line) for line in r.stdout.splitlines()) > 80
