"""GET /props: what the server was started with, in llama-server's shape, so that a client (the web
page) can start from the server's own sampling defaults and know the context it has to fit in."""

from llogos_cli import __version__
from llogos_cli.engine.sampling import SamplingParams


def sampling_settings(p: SamplingParams, n_predict: int) -> dict:
    """Sampling parameters under llama-server's names, as /props and /slots give them."""
    return {"temperature": p.temp, "top_k": p.top_k, "top_p": p.top_p, "min_p": p.min_p,
            "typical_p": p.typical_p, "repeat_penalty": p.repeat_penalty, "repeat_last_n": p.repeat_last_n,
            "presence_penalty": p.presence_penalty, "frequency_penalty": p.frequency_penalty,
            "dry_multiplier": p.dry_multiplier, "xtc_probability": p.xtc_probability, "mirostat": p.mirostat,
            "n_predict": n_predict, "samplers": list(p.samplers),
            "seed": -1 if p.seed is None else p.seed}   # llama-server's -1: a fresh seed per request


def props(model_path: str, n_slots: int, loaded, model_id: str = "") -> dict:
    """`loaded` is the app's LoadedModel: its defaults are `serve`'s flags over the model's own."""
    return {"default_generation_settings": {"n_ctx": loaded.n_ctx, "params": sampling_settings(
                loaded.defaults.params, loaded.defaults.n_predict)},
            "total_slots": n_slots,
            "model_alias": model_id,
            "model_path": model_path,
            "chat_template": loaded.chat.template.source if loaded.chat else "",
            "modalities": {"vision": False, "audio": False},
            "build_info": f"llogos {__version__}"}
