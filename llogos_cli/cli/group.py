"""The `llogos` command group; each command module registers itself on it."""

import os
import sys

import click

from llogos_cli import __version__
from llogos_cli.cli.llama_flags import LlamaCommand


class _Group(click.Group):
    command_class = LlamaCommand   # each command takes llama.cpp's spellings of its options

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            # The reader of stdout went away (`| head`): it has what it wanted, so stop quietly with
            # success, like other Unix tools. stdout now leads nowhere, so the flush at exit cannot fail.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise click.exceptions.Exit(0) from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="llogos")
def cli():
    """Run GGUF language models: NumPy on the CPU, hand-written CUDA kernels on the GPU."""
