"""Which cache slots are free: the only bookkeeping a slot-per-sequence KV cache needs."""


class SlotPool:
    def __init__(self, n_slots: int):
        self._free = list(range(n_slots - 1, -1, -1))   # popped from the end: lowest slot first

    @property
    def n_free(self) -> int:
        return len(self._free)

    def take(self, slot: int | None = None) -> int:
        """The lowest free slot, or the one named."""
        if slot is None:
            return self._free.pop()
        self._free.remove(slot)
        return slot

    @property
    def free(self) -> list[int]:
        """The free slots, highest first."""
        return list(self._free)

    def give(self, slot: int) -> None:
        self._free.append(slot)
        self._free.sort(reverse=True)   # keep handing out low slots, so busy slots stay contiguous
