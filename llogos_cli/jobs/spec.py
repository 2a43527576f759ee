"""What a batch job runs with, and from it a loaded model, its batch engine and what turns lines into requests.

The same on one machine and in every Ray worker (a JobSpec travels to each), so that a prompt gets
the same request, and with the same seed the same text, wherever it runs.
"""

from dataclasses import dataclass

from llogos_cli.engine.batch import BatchEngine
from llogos_cli.engine.conversation import ChatFormat, TemplateChoice
from llogos_cli.engine.draft_model import load_draft_model
from llogos_cli.engine.sampling import SamplingOverrides
from llogos_cli.engine.speculation import SpecParams
from llogos_cli.engine.stops import StopCriteria
from llogos_cli.jobs.lines import LineDefaults
from llogos_cli.model.loader import LoadOptions
from llogos_cli.tokenizer.tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class JobSpec:
    """`llogos batch`'s flags that shape what runs: the model, the slots and each line's defaults."""
    model: LoadOptions
    sampling: SamplingOverrides
    template: TemplateChoice
    parallel: int                  # -np: slots
    batch_size: int                # -b: tokens a step
    n_predict: int = -1
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    logprobs: int = 0
    split_reasoning: bool = True   # --reasoning-format
    speculation: SpecParams = SpecParams()


@dataclass(frozen=True, slots=True)
class BatchSetup:
    tokenizer: Tokenizer
    chat: ChatFormat | None
    defaults: LineDefaults
    engine: BatchEngine
    description: str           # "8 slots of 4096 tokens on cpu"


def set_up(spec: JobSpec, seed: int) -> BatchSetup:
    """Open and load the spec's model. `seed` is the run's seed unless --seed or the model's
    sampling defaults name one."""
    mf = spec.model.open()
    params = spec.sampling.params(mf.sampling_defaults)
    chat = spec.template.format_or_none(mf)
    defaults = LineDefaults(params, StopCriteria(spec.n_predict, spec.stop, spec.ignore_eos), spec.logprobs,
                            params.seed if params.seed is not None else seed, spec.split_reasoning)
    n_ctx = spec.model.n_ctx(mf)
    m = spec.model.load(mf, n_ctx, spec.parallel)
    engine = BatchEngine(m.model, mf.tokenizer, spec.parallel, n_ctx, spec.model.cache_types, spec.batch_size,
                         speculation=spec.speculation,
                         draft_model=load_draft_model(spec.speculation, spec.model, m, n_ctx, spec.parallel))
    where = f"{spec.parallel} slots of {n_ctx} tokens on {m.model.backend.name}"
    return BatchSetup(mf.tokenizer, chat, defaults, engine, where)
