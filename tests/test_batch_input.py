"""A `llogos batch` line to a request: the sampling fields it shares with the server's requests."""

from llogos_cli.jobs.lines import Line, LineDefaults, LineError, to_request
from llogos_cli.engine.sampling import SamplingParams
from llogos_cli.engine.stops import StopCriteria
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.tokenizer.tokenizer import Tokenizer
from tests.conftest import FIXTURES, need


def test_a_line_takes_the_servers_sampling_fields_with_their_types():
    tok = Tokenizer.from_gguf(GGUFFile(need(FIXTURES / "tiny-llama-f32.gguf")))
    d = LineDefaults(SamplingParams(), StopCriteria(4), 0, 7)
    r = to_request(Line("a", 1, {"prompt": "hi", "presence_penalty": 0.5, "frequency_penalty": 0.25,
                                 "repeat_penalty": 1.1, "top_k": 5, "temperature": 1}), tok, None, d)
    p = r.params
    assert (p.presence_penalty, p.frequency_penalty, p.repeat_penalty, p.top_k, p.temp) == (0.5, 0.25, 1.1, 5, 1)
    for fields in ({"top_k": 2.5}, {"seed": 1.0}, {"frequency_penalty": "0.5"}, {"repeat_penalty": True}):
        e = to_request(Line("b", 2, {"prompt": "hi", **fields}), tok, None, d)
        assert isinstance(e, LineError) and "wrong type" in e.error, fields
