"""/v1/rerank (and llama-server's /rerank, /reranking, /v1/reranking): a query and its documents
scored by the model's classification head (engine/rerank.py), in Jina's and Cohere's shape, or in
Hugging Face TEI's where the request gives `texts` instead of `documents`, as llama-server decides.

Served where `llogos serve` was started with --reranking (or --pooling rank), as llama-server asks;
a model whose GGUF has no classification head answers 400. Pairs are tokenized on a worker thread
and scored on the engine thread between steps, like embeddings.
"""

from typing import Annotated

from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field, model_validator

from llogos_cli.engine.rerank import Reranker
from llogos_cli.errors import LlogosError
from llogos_cli.server.embeddings import MAX_INPUTS, on_engine
from llogos_cli.server.errors import ApiError
from llogos_cli.server.schemas import _Strict

PATHS = ("/v1/rerank", "/rerank", "/reranking", "/v1/reranking")
NOT_STARTED = "This server does not rerank: start it with --reranking (or --pooling rank)"


class Document(BaseModel):
    """A document given as an object (Jina's and Cohere's clients send {"text": ...}; other fields ride along)."""
    model_config = ConfigDict(extra="allow", strict=True)
    text: str


Documents = Annotated[list[str | Document], Field(min_length=1, max_length=MAX_INPUTS)]


class RerankRequest(_Strict):
    query: str
    documents: Documents | None = None
    texts: Annotated[list[str], Field(min_length=1, max_length=MAX_INPUTS)] | None = None   # TEI's
    model: str | None = None
    top_n: Annotated[int, Field(ge=1)] | None = None
    return_documents: bool = False
    return_text: bool = False   # TEI's return_documents

    @model_validator(mode="after")
    def _one_list(self):
        if (self.documents is None) == (self.texts is None):
            raise ValueError("give the documents to rank as `documents` (or TEI's `texts`), one of them")
        return self

    @property
    def tei(self) -> bool:
        return self.texts is not None

    def document_texts(self) -> list[str]:
        return self.texts if self.tei else [d if isinstance(d, str) else d.text for d in self.documents]


def load(reranking: bool, model, opened, n_ctx: int) -> Reranker | LlogosError | None:
    """What the server reranks with: None where reranking is off, the error where the model cannot rank."""
    if not reranking:
        return None
    try:
        return Reranker.from_file(model, opened.file, opened.tokenizer, n_ctx)
    except LlogosError as e:
        return e


async def rerank(loaded, model_id: str, body: RerankRequest):
    reranker = loaded.reranker
    if reranker is None:
        raise ApiError(501, NOT_STARTED, code="not_supported")
    if isinstance(reranker, LlogosError):
        raise ApiError(400, str(reranker), param="model")
    texts = body.document_texts()
    prompts = await run_in_threadpool(lambda: [reranker.pair(body.query, text) for text in texts])
    for i, prompt in enumerate(prompts):
        if len(prompt.ids) > loaded.n_ctx:
            raise ApiError(400, f"the query with document {i} is {len(prompt.ids)} tokens, more than the context "
                           f"of {loaded.n_ctx} tokens (-c)", param="documents", code="context_length_exceeded")
    scores = (await on_engine(loaded, lambda: reranker.scores(prompts), "documents"))[:, 0]
    order = sorted(range(len(texts)), key=lambda i: -scores[i])[:body.top_n]   # stable: ties keep their order
    if body.tei:
        return [{"index": i, "score": float(scores[i])} | ({"text": texts[i]} if body.return_text else {})
                for i in order]
    results = [{"index": i, "relevance_score": float(scores[i])}
               | ({"document": {"text": texts[i]}} if body.return_documents else {}) for i in order]
    n_tokens = sum(len(p.ids) for p in prompts)
    return {"object": "list", "model": body.model or model_id, "results": results,
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}
