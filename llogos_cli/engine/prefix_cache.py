"""Which blocks of KV each row holds, and which of them hold which prompt prefixes: the block manager.

Tokens are cut into blocks of BLOCK_SIZE. A row's block table lists the blocks holding its tokens;
blocks are taken as the row grows and reference-counted. A full block is named by a hash chain,
the digest of its tokens and of its parent's digest, so two prompts share a block (the same block
in both tables, read-only: only full blocks are named) when they agree on every token up to its
end. A block nobody uses goes to a free list: a named one keeps its contents and its name, so a
later prompt can still hit it, until a new block needs its room (unnamed blocks first, then the
least recently used). This module only keeps the books: the KV data lives in the runner's cache,
one pool entry per block id.
"""

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

BLOCK_SIZE = 16   # tokens per block: small enough that a prompt diverging mid-block loses little
CACHE_RAM_MIB = 1024   # what the pool may hold by default (--cache-ram)
ROOT = b""        # the parent digest of a prompt's first block


def block_hash(parent: bytes, tokens) -> bytes:
    """The name of a full block: its tokens and, through parent, everything before them."""
    return hashlib.blake2b(parent + np.asarray(tokens, np.int64).tobytes(), digest_size=16).digest()


@dataclass(slots=True)
class Block:
    id: int
    digest: bytes = ROOT      # ROOT: holds nothing cached yet
    refs: int = 0


class BlockManager:
    def __init__(self, n_blocks: int, block_size: int = BLOCK_SIZE):
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(n_blocks)]
        self._by_digest: dict[bytes, Block] = {}
        self._unused: OrderedDict[int, Block] = OrderedDict()   # refs 0, least recently used first
        for block in self.blocks:
            self._unused[block.id] = block

    @property
    def n_free(self) -> int:
        """Blocks a new prefix may take: never used, or cached but used by no row."""
        return len(self._unused)

    def match(self, tokens: list[int], limit: int) -> list[int]:
        """The longest cached run of full blocks that begins `tokens` and holds at most `limit`
        tokens, each block acquired (a reference taken); -> their ids, in order."""
        ids, parent, B = [], ROOT, self.block_size
        for i in range(min(limit, len(tokens)) // B):
            block = self._by_digest.get(block_hash(parent, tokens[i * B:(i + 1) * B]))
            if block is None:
                break
            self._acquire(block)
            ids.append(block.id)
            parent = block.digest
        return ids

    def named(self, block_id: int) -> bool:
        """Whether the block is in the cache by its name: other rows may read it, so none writes it."""
        return self.blocks[block_id].digest != ROOT

    def take(self, n: int) -> list[int]:
        """n blocks for new tokens, each with one reference and no name; the caller has checked
        n_free. Unnamed blocks go first, then the least recently used named ones."""
        taken = [self._take(ROOT) for _ in range(n)]
        for block in taken:
            block.refs = 1
        return [block.id for block in taken]

    def seal(self, table: list[int], tokens: list[int], n: int, n_sealed: int) -> int:
        """Name the full blocks of tokens[:n] from table[n_sealed] on, now that they are written;
        -> the number of named blocks at the head of the table. A block whose name another block
        already has is swapped for that one (the same tokens after the same prefix: the same KV)."""
        B = self.block_size
        parent = self.blocks[table[n_sealed - 1]].digest if n_sealed else ROOT
        for i in range(n_sealed, min(n // B, len(table))):
            digest = block_hash(parent, tokens[i * B:(i + 1) * B])
            same = self._by_digest.get(digest)
            if same is None:
                self._name(self.blocks[table[i]], digest)
            elif same.id != table[i]:
                self._acquire(same)
                self.release([table[i]])
                table[i] = same.id
            parent = digest
        return max(n_sealed, min(n // B, len(table)))

    def extend(self, table: list[int], tokens: list[int], n: int | None = None) -> list[tuple[int, int]]:
        """Add the full blocks of tokens[:n] past those in `table` (a row's blocks, extended in place).
        A block already cached is shared; a new one takes a free block. -> (index in table, block id)
        of each new block, whose KV the caller copies in. Stops early when every block is in use."""
        B = self.block_size
        parent = self.blocks[table[-1]].digest if table else ROOT
        new = []
        for i in range(len(table), (len(tokens) if n is None else n) // B):
            digest = block_hash(parent, tokens[i * B:(i + 1) * B])
            block = self._by_digest.get(digest)
            if block is None:
                block = self._take(digest)
                if block is None:
                    break
                new.append((i, block.id))
            self._acquire(block)
            table.append(block.id)
            parent = digest
        return new

    def own(self, table: list[int], first: int) -> list[tuple[int, int]] | None:
        """Make table[first:] the row's alone to write in place (a context shift): a block other
        rows hold too is swapped for a fresh one, a named block held here alone loses its name (its
        contents will no longer be its tokens'). -> (source, destination) of each swapped block,
        whose KV the caller copies; None, and nothing changed, when too few blocks are free."""
        shared = [i for i in range(first, len(table)) if self.blocks[table[i]].refs > 1]
        if len(shared) > self.n_free:
            return None
        copies = []
        for i in range(first, len(table)):
            block = self.blocks[table[i]]
            if block.refs > 1:
                block.refs -= 1   # the other rows keep it
                table[i] = self.take(1)[0]
                copies.append((block.id, table[i]))
            else:
                self._name(block, ROOT)
        return copies

    def release(self, table: list[int]) -> None:
        """A row is done with its blocks. The last block goes to the LRU list first, so a prefix's
        tail is evicted before its head, which more prompts share; an unnamed block, which no
        prompt can hit, is the first to be taken again."""
        for block_id in reversed(table):
            block = self.blocks[block_id]
            block.refs -= 1
            if block.refs == 0:
                self._unused[block_id] = block
                if block.digest == ROOT:
                    self._unused.move_to_end(block_id, last=False)
        table.clear()

    def _acquire(self, block: Block) -> None:
        self._unused.pop(block.id, None)
        block.refs += 1

    def _take(self, digest: bytes) -> Block | None:
        """The least recently used unreferenced block, renamed for new contents; None if none is."""
        if not self._unused:
            return None
        _, block = self._unused.popitem(last=False)
        self._name(block, digest)
        return block

    def _name(self, block: Block, digest: bytes) -> None:
        if block.digest != ROOT:
            del self._by_digest[block.digest]
        block.digest = digest
        if digest != ROOT:
            self._by_digest[digest] = block
