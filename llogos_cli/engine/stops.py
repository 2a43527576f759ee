"""When a generation ends: token limits, end-of-generation tokens, and stop strings."""

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StopCriteria:
    n_predict: int = -1               # -1: until end of generation or a full context
    stop_strings: tuple[str, ...] = ()
    ignore_eos: bool = False
    stop_ids: frozenset[int] = frozenset()   # end a reply, like EOG, even with ignore_eos (chat's end of turn)


class StopFilter:
    """Releases generated text, holding back any tail that could be the start of a stop string."""

    def __init__(self, stop_strings: tuple[str, ...]):
        self.stops = [s for s in stop_strings if s]
        self.pending = ""
        self.hit = False

    def push(self, text: str) -> str:
        self.pending += text
        cut = min((i for i in (self.pending.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.hit = True
            out, self.pending = self.pending[:cut], ""
            return out
        hold = max((n for s in self.stops for n in range(1, min(len(s), len(self.pending)) + 1)
                    if self.pending.endswith(s[:n])), default=0)
        out = self.pending[:len(self.pending) - hold]
        self.pending = self.pending[len(out):]
        return out

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out
