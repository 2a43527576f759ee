"""Where the tokens of a batch go, worked out once per forward pass (CudaBackend.batch_layout).

The kernels read each token's slot and position from device arrays. The host-side runs only decide
how the launchers split the work (which tokens one launch takes, which attention path a run takes),
so the launches of a decode step do not depend on which slots or positions its rows hold: a step
captured in a CUDA graph replays for other rows once the device arrays are rewritten.
"""

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np


class Run(NamedTuple):
    """Tokens t0..t1 of a batch: one slot's consecutive positions."""
    slot: int
    t0: int
    t1: int


@dataclass(frozen=True, slots=True)
class Layout:
    slots: Any                 # device int32 (T,): each token's cache slot
    pos: Any                   # device int32 (T,): each token's position in its slot
    host_pos: np.ndarray       # (T,) int32, the same positions on the host
    runs: tuple[Run, ...]
    groups: tuple[tuple[int, int, int], ...]  # (t0, t1, n): consecutive runs of n tokens each
    max_slot: int
    max_pos: int

    def ends(self) -> np.ndarray:
        """(T,) int32: the position of the last token of each token's run, as far as the token
        sees where attention is not causal (encoders)."""
        return np.repeat(np.array([self.host_pos[t1 - 1] for _, _, t1 in self.runs], np.int32),
                         [t1 - t0 for _, t0, t1 in self.runs])


def batch_layout(slots: np.ndarray, pos: np.ndarray, device_slots, device_pos) -> Layout:
    """The layout of a batch from its host arrays and their device copies.

    A run ends where the slot changes or the positions stop being consecutive. Padding rows of a
    decode step (all at the scratch slot, position 0) are thus runs of one token each, like the
    real rows, and the step's launches stay the same whatever rows it holds."""
    n = len(slots)
    ends = np.flatnonzero((np.diff(slots) != 0) | (np.diff(pos) != 1)) + 1
    t0s, t1s = np.concatenate([[0], ends]), np.concatenate([ends, [n]])
    runs = tuple(Run(int(slots[a]), int(a), int(b)) for a, b in zip(t0s, t1s))
    lengths = t1s - t0s
    cuts = np.flatnonzero(np.diff(lengths)) + 1   # where the run length changes
    first, last = np.concatenate([[0], cuts]), np.concatenate([cuts, [len(runs)]]) - 1
    groups = tuple((int(t0s[a]), int(t1s[b]), int(lengths[a])) for a, b in zip(first, last))
    return Layout(device_slots, device_pos, pos, runs, groups, int(slots.max()), int(pos.max()))
