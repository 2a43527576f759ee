"""The `llogos` entry point: runs the command group and turns every failure into one line on stderr.

Generated text goes to stdout; progress, timings and errors go to stderr.
"""

import sys

import click

from llogos_cli.cli.group import cli
from llogos_cli.console import err, error
from llogos_cli.errors import LlogosError


def main() -> None:
    try:
        code = cli.main(standalone_mode=False, prog_name="llogos")
    except click.exceptions.NoArgsIsHelpError as e:  # bare `llogos`: the help, not an error
        click.echo(e.ctx.get_help(), err=True)
        code = e.exit_code
    except click.ClickException as e:  # usage errors exit 2, as Click does
        error(e.format_message())
        code = e.exit_code
    except click.Abort:
        code = 130
    except LlogosError as e:
        error(str(e))
        code = 1
    except MemoryError:  # NumPy's and CuPy's out-of-memory errors are both MemoryErrors
        error("out of memory: try a smaller -c/--ctx-size or a smaller model")
        code = 1
    except KeyboardInterrupt:
        err.print("\n[dim]interrupted[/dim]")
        code = 130
    sys.exit(code if isinstance(code, int) else 0)
