"""`llogos batch` progress: prompts done and tokens/s, live on a terminal and as one line at the end."""

import time

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from llogos_cli.console import err


class Tally:
    """Counts finished prompts, their generated tokens and failures while a run goes on."""

    def __init__(self, total: int | None):
        self.done = self.failed = self.tokens = 0
        self._progress = Progress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                                  MofNCompleteColumn(), TextColumn("{task.fields[rate]}"), TimeElapsedColumn(),
                                  TimeRemainingColumn(), console=err, transient=False, disable=not err.is_terminal)
        self._task = self._progress.add_task("batch", total=total, rate="")
        self._t0 = time.perf_counter()

    def __enter__(self) -> "Tally":
        self._t0 = time.perf_counter()
        self._progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self._progress.stop()

    @property
    def elapsed(self) -> float:
        return max(time.perf_counter() - self._t0, 1e-9)

    def add(self, tokens: int = 0, failed: bool = False) -> None:
        """One prompt finished (or failed) with `tokens` generated."""
        self.done += 1
        self.failed += failed
        self.tokens += tokens
        self._progress.update(self._task, advance=1, rate=f"{self.tokens / self.elapsed:7.1f} tok/s")

    def summary(self, where: str = "") -> None:
        err.print(f"[dim]{self.done} prompts ({self.failed} failed), {self.tokens} tokens generated{where} "
                  f"in {self.elapsed:.1f} s: {self.tokens / self.elapsed:.1f} tok/s[/dim]", soft_wrap=True)
