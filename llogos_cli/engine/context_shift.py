"""llama.cpp's context shift: a generation that reaches the context size goes on.

When a row's next token has no position left, it keeps its first n_keep tokens (the request's
--keep, BOS kept besides; -1: its whole prompt), drops the oldest half of the rest (llama.cpp's
n_discard = (n_past - n_keep) / 2) and moves the others down, their keys turned back by RoPE
(model/kv_shift.py). What the dropped tokens contributed to the kept tokens' KV stays, as in
llama.cpp. Blocks other rows share, or that the prefix cache names, are not written in place: a
shared block is copied to one of the row's own first, and the row names no block past n_keep
again, nor parks (its KV is no longer its tokens' alone). Recurrent layers' state cannot be
shifted: such a model's row ends as at its limit, with one line saying why.
"""

from llogos_cli.console import warn
from llogos_cli.engine.prefix_cache import BlockManager

# llama-server keeps n_keep below n_ctx - 4: a shift always has tokens to drop.
KEEP_MARGIN = 4


def plan(n_keep: int, prompt: list[int], bos_id: int | None, n_past: int, n_ctx: int) -> tuple[int, int]:
    """(tokens kept, tokens dropped) of a shift of n_past tokens; none dropped: it cannot make room."""
    if n_keep < 0:
        n_keep = len(prompt)
    elif prompt and prompt[0] == bos_id:
        n_keep += 1
    n_keep = min(n_keep, n_ctx - KEEP_MARGIN, n_past)
    n_left = n_past - n_keep
    return n_keep, min(n_left // 2, max(0, n_left - 1))


class ContextShift:
    """Shifts the context of the engine's rows that reach its end: the books in the block manager,
    the KV through the runner."""

    def __init__(self, runner, blocks: BlockManager, n_ctx: int, bos_id: int | None, recurrent: bool,
                 n_keep: int = 0):
        self.runner, self.blocks, self.n_ctx, self.bos_id = runner, blocks, n_ctx, bos_id
        self.recurrent, self.n_keep = recurrent, n_keep   # n_keep: for requests that give none
        self._told = False

    def make_room(self, row) -> bool:
        """Shift the row so that its last token has a position; False when it cannot (it must end)."""
        if self.recurrent:
            if not self._told:
                warn("context shift: this model's recurrent layers cannot be shifted, so a generation stops "
                     f"when it fills the context of {self.n_ctx} tokens")
                self._told = True
            return False
        n_past, B = row.n_cached, self.blocks.block_size
        asked = self.n_keep if row.request.n_keep is None else row.request.n_keep
        n_keep, n_discard = plan(asked, row.completion.prompt, self.bos_id, n_past, self.n_ctx)
        copies = self.blocks.own(row.blocks, n_keep // B) if n_discard else None
        if copies is None:
            return False
        self.runner.shift(row, copies, n_keep, n_discard, n_past)
        del row.tokens[n_keep:n_keep + n_discard]
        row.n_cached = n_past - n_discard
        unused = row.blocks[-(-row.n_cached // B):]
        del row.blocks[-(-row.n_cached // B):]
        self.blocks.release(unused)
        row.n_sealed = min(row.n_sealed, n_keep // B)
        row.shifted = True
        row.completion.shifted(n_discard)
        return True
