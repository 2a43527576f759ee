"""GET /props: what the server was started with, in llama-server's shape, so that a client (the web
page) can start from the server's own sampling defaults and know the context it has to fit in."""

from llogos_cli import __version__


def props(model_path: str, n_slots: int, loaded) -> dict:
    """`loaded` is the app's LoadedModel: its defaults are `serve`'s flags over the model's own."""
    p = loaded.defaults.params
    params = {"temperature": p.temp, "top_k": p.top_k, "top_p": p.top_p, "min_p": p.min_p,
              "repeat_penalty": p.repeat_penalty, "repeat_last_n": p.repeat_last_n,
              "presence_penalty": p.presence_penalty, "frequency_penalty": p.frequency_penalty,
              "n_predict": loaded.defaults.n_predict,
              "seed": -1 if p.seed is None else p.seed}   # llama-server's -1: a fresh seed per request
    return {"default_generation_settings": {"n_ctx": loaded.n_ctx, "params": params},
            "total_slots": n_slots,
            "model_path": model_path,
            "chat_template": loaded.chat.template.source if loaded.chat else "",
            "modalities": {"vision": False, "audio": False},
            "build_info": f"llogos {__version__}"}
