"""The `llogos` command group; each command module registers itself on it."""

import click

from llogos_cli import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="llogos")
def cli():
    """Run GGUF language models: NumPy on the CPU, hand-written CUDA kernels on the GPU."""
