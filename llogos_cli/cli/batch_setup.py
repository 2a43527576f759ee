"""From `llogos batch`'s options to a loaded model, its batch engine and what turns lines into requests.

The same on one machine and in every Ray worker, so that a prompt gets the same request, and
with the same seed the same text, wherever it runs.
"""

from dataclasses import dataclass

from llogos_cli.cli.batch_input import LineDefaults
from llogos_cli.cli.options import cache_types, chat_format_or_none, sampling_params, threads
from llogos_cli.engine.batch import BatchEngine
from llogos_cli.engine.conversation import ChatFormat
from llogos_cli.engine.stops import StopCriteria
from llogos_cli.model.loader import load, open_model
from llogos_cli.tokenizer.tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class BatchSetup:
    tokenizer: Tokenizer
    chat: ChatFormat | None
    defaults: LineDefaults
    engine: BatchEngine
    description: str           # "8 slots of 4096 tokens on cpu"


def set_up(o: dict, seed: int) -> BatchSetup:
    """Open and load the model of the options `o`. `seed` is the run's seed unless --seed or the
    model's sampling defaults name one."""
    mf = open_model(o["model_name"])
    tok = mf.tokenizer
    params = sampling_params(o, mf.sampling_defaults)
    chat = chat_format_or_none(o, mf.file.meta, mf.entry, tok)
    defaults = LineDefaults(params, StopCriteria(o["n_predict"], tuple(o["stop"]), o["ignore_eos"]), o["logprobs"],
                        params.seed if params.seed is not None else seed)
    n_ctx = mf.n_ctx(o["ctx_size"], o["allow_long_ctx"])
    m = load(mf, o["backend"], o["cpu_weights"], n_ctx, cache_types(o), o["parallel"], threads=threads(o))
    engine = BatchEngine(m.model, tok, o["parallel"], n_ctx, cache_types(o), o["batch_size"])
    return BatchSetup(tok, chat, defaults, engine, f"{o['parallel']} slots of {n_ctx} tokens on {m.model.backend.name}")
