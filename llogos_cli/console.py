"""The stderr console: progress, timings, notices and errors. stdout is kept for generated text."""

from rich.console import Console
from rich.markup import escape

# rich honours NO_COLOR and drops styling when stderr is not a terminal.
err = Console(stderr=True, highlight=False)


def notice(message: str) -> None:
    err.print(f"[dim]{escape(message)}[/dim]", soft_wrap=True)


def warn(message: str) -> None:
    err.print(f"[yellow]warning:[/yellow] {escape(message)}", soft_wrap=True)


def error(message: str) -> None:
    err.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)
