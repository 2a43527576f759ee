"""The stderr console: progress, timings, notices and errors. stdout is kept for generated text."""

from rich.console import Console

# rich honours NO_COLOR and drops styling when stderr is not a terminal.
err = Console(stderr=True, highlight=False)


def notice(message: str) -> None:
    err.print(f"[dim]{message}[/dim]")


def warn(message: str) -> None:
    err.print(f"[yellow]warning:[/yellow] {message}")
