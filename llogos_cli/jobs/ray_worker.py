"""One worker of `llogos batch --ray`: a loaded model and its batch engine, fed input lines by Ray Data.

Ray Data builds the worker once per actor and calls it with batches of parsed lines (columns
place, line, id and fields, the last two as JSON text); it answers with one JSON result per line,
built exactly as on one machine. A worker that could not load its model answers with one row of
place -1 whose record is why, which the driver reports as the run's error. Nothing here imports
Ray: Ray Data drives a plain class.
"""

import json
import platform

import numpy as np

from llogos_cli.jobs.lines import Line, LineError, to_request
from llogos_cli.jobs.spec import JobSpec, set_up
from llogos_cli.errors import LlogosError


class BatchWorker:
    def __init__(self, spec: JobSpec, seed: int):
        # A failure here is kept for the calls to answer: Ray Data replaces an actor that dies
        # while being built, again and again, and an exception from a call reaches the driver
        # wrapped in Ray's, with stack traces; a row of its own reaches it as it is.
        self._error = None
        try:
            self._setup = set_up(spec, seed)
        except LlogosError as e:
            self._error = f"worker on node {platform.node()}: {e}"

    def __call__(self, rows: dict) -> dict:
        if self._error is not None:
            return {"place": np.array([-1]), "record": np.array([self._error], object),
                    "tokens": np.array([0]), "failed": np.array([True])}
        setup = self._setup
        answers: list[tuple[int, dict, int, bool]] = []   # (place in the input, result, tokens, failed)
        place_of: dict[str, int] = {}                      # request id -> its place in the input
        requests = []
        for place, number, rid, fields in zip(rows["place"], rows["line"], rows["id"], rows["fields"]):
            line = Line(json.loads(rid), int(number), json.loads(fields))
            item = to_request(line, setup.tokenizer, setup.chat, setup.defaults)
            if isinstance(item, LineError):
                answers.append((int(place), item.as_dict(), 0, True))
            else:
                place_of[repr(item.id)] = int(place)
                requests.append(item)
        for result in setup.engine.generate(requests):
            answers.append((place_of[repr(result.id)], result.as_dict(), len(result.tokens), result.error is not None))
        return {"place": np.array([d[0] for d in answers], np.int64),
                "record": np.array([json.dumps(d[1], ensure_ascii=False) for d in answers], object),
                "tokens": np.array([d[2] for d in answers], np.int64),
                "failed": np.array([d[3] for d in answers], bool)}
