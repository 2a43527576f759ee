"""The `llogos` command group; each command module registers itself on it when first needed."""

import importlib
import os
import sys

import click

from llogos_cli import __version__
from llogos_cli.cli.llama_flags import LlamaCommand


# The module of llogos_cli.cli that registers each command. A command's module is imported only when
# the command runs: `generate` then starts without the server's and batch's imports (pydantic and more).
COMMAND_MODULES = {"generate": "generate", "chat": "chat", "batch": "batch", "embed": "embed", "serve": "serve",
                   "models": "tools", "pull": "tools", "info": "tools", "tokenize": "tools", "perplexity": "tools",
                   "lookup-create": "lookup"}


class _Group(click.Group):
    command_class = LlamaCommand   # each command takes llama.cpp's spellings of its options

    def get_command(self, ctx, cmd_name):
        if cmd_name not in self.commands and cmd_name in COMMAND_MODULES:
            importlib.import_module(f"llogos_cli.cli.{COMMAND_MODULES[cmd_name]}")
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx):
        for module in set(COMMAND_MODULES.values()):
            importlib.import_module(f"llogos_cli.cli.{module}")
        return super().list_commands(ctx)

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
