"""The context shift's options (engine/context_shift.py), with llama.cpp's names."""

import click


def context_shift_options(on: bool):
    """--context-shift/--no-context-shift (on by default where `on`) and --keep, as the keyword
    arguments context_shift and keep."""
    def decorate(f):
        f = click.option("--keep", type=click.IntRange(min=-1), default=0, show_default=True,
                         help="Prompt tokens a context shift keeps (BOS besides); -1 = the whole prompt.")(f)
        return click.option("--context-shift/--no-context-shift", default=on, show_default=True,
                            help="When the context fills, drop the older half of what follows the kept "
                                 "tokens and go on, as llama.cpp does.")(f)
    return decorate
