"""/v1/embeddings in OpenAI's shape, and llama-server's own /embedding: texts or token ids to the
engine's Embedder, run on the engine thread between steps, the vectors back as JSON numbers or, as
the `openai` client asks by default, base64 of their float32 bytes.

Vectors are pooled as the model's GGUF says (pooling_type) and normalised to unit length, as
llama-server does; a model that pools nothing (one vector a token) has no OpenAI embedding, so
/v1/embeddings refuses it where /embedding answers a vector per token.
"""

import base64
from typing import Annotated, Literal

import numpy as np
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field

from llogos_cli.engine.embedding import DEFAULT_NORMALIZE, Embedder, EmbedOptions, prompt_ids
from llogos_cli.errors import LlogosError
from llogos_cli.server.engine_thread import CallFailed, ShuttingDown
from llogos_cli.server.errors import ApiError
from llogos_cli.server.schemas import _Strict

MAX_INPUTS = 2048   # OpenAI's limit on one request's inputs

TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
Inputs = str | Annotated[list[str], Field(min_length=1, max_length=MAX_INPUTS)] | TokenIds | \
    Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_INPUTS)]


class EmbeddingRequest(_Strict):
    input: Inputs
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None


class LlamaEmbeddingRequest(_Strict):
    """llama-server's /embedding: `content` as /v1/embeddings' `input`."""
    content: Inputs
    model: str | None = None


class EmbeddingItem(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingItem]
    model: str
    usage: EmbeddingUsage


async def v1_embeddings(loaded, model_id: str, body: EmbeddingRequest) -> EmbeddingList:
    cfg = _model(loaded).cfg
    if body.dimensions is not None and body.dimensions != cfg.n_embd:
        raise ApiError(400, f"dimensions {body.dimensions} is not supported: this model's embeddings have "
                       f"{cfg.n_embd}", param="dimensions")
    if (loaded.pooling or cfg.pooling) == "none":
        raise ApiError(400, "this model pools nothing (pooling_type none): /v1/embeddings needs one vector a "
                       "text; /embedding gives one a token", param="input")
    prompts = await run_in_threadpool(_token_lists, loaded.tokenizer, body.input)
    vectors = await _embed(loaded, prompts)
    data = [EmbeddingItem(index=i, embedding=_encode(v, body.encoding_format)) for i, v in enumerate(vectors)]
    n_tokens = sum(map(len, prompts))
    return EmbeddingList(data=data, model=model_id, usage=EmbeddingUsage(prompt_tokens=n_tokens, total_tokens=n_tokens))


async def llama_embedding(loaded, body: LlamaEmbeddingRequest) -> list[dict]:
    """llama-server's shape: per input, its index and a list of vectors (one, or one a token)."""
    prompts = await run_in_threadpool(_token_lists, loaded.tokenizer, body.content)
    vectors = await _embed(loaded, prompts)
    return [{"index": i, "embedding": v.reshape(-1, v.shape[-1]).tolist()} for i, v in enumerate(vectors)]


def _token_lists(tokenizer, inputs) -> list[list[int]]:
    if isinstance(inputs, str):
        inputs = [inputs]
    if inputs and isinstance(inputs[0], int):
        inputs = [inputs]
    return [prompt_ids(tokenizer, x) if isinstance(x, str) else list(x) for x in inputs]


def _model(loaded):
    """The loaded model, whose config (immutable) the event loop may read; only the engine thread runs it."""
    return loaded.engine.engine.runner.model


async def _embed(loaded, prompts: list[list[int]]) -> list[np.ndarray]:
    model = _model(loaded)
    try:
        options = EmbedOptions(loaded.pooling or model.cfg.pooling, DEFAULT_NORMALIZE)
    except LlogosError as e:
        raise ApiError(400, str(e), param="input") from None
    return await on_engine(loaded, lambda: Embedder(model, loaded.n_ctx).embed(prompts, options), "input")


async def on_engine(loaded, fn, param: str):
    """fn() run on the engine thread between steps; what it refuses (a LlogosError) a 400 naming param."""
    try:
        return await loaded.engine.call(fn)
    except ShuttingDown as e:
        raise ApiError(503, str(e), code="shutting_down") from None
    except CallFailed as e:
        raise ApiError(500, str(e), code="engine_error") from None
    except LlogosError as e:
        raise ApiError(400, str(e), param=param) from None


def _encode(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":   # little-endian float32, what the openai client decodes
        return base64.b64encode(vector.astype("<f4").tobytes()).decode()
    return vector.tolist()
