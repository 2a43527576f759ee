"""Reranking: a query and a document read together as one prompt by a cross-encoder, scored by its
classification head (model/rank_head.py), as llama.cpp's rank pooling does for llama-server's
/rerank and `llama-embedding --pooling rank`.

A pair's prompt is the GGUF's rerank template (tokenizer.chat_template.rerank, Qwen3-Reranker's)
with {query} and {document} put in, read with its special tokens; else the query and the document,
each closed by the token the vocabulary ends a text with, after BOS where it begins one: BERT's
[CLS] query [SEP] document [SEP]. Where the encoder has a second token type, the document and its
[SEP] are of type 1, as BERT cross-encoders are trained (llama.cpp gives every token type 0, which
scores such a model differently from transformers). Pairs run through the Embedder, which batches
them and keeps each in a slot of its own.
"""

from dataclasses import dataclass

import numpy as np

from llogos_cli.engine.embedding import Embedder, EmbedOptions, prompt_ids
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.model.forward import Model
from llogos_cli.model.memory import PREFILL_BATCH
from llogos_cli.model.rank_head import RankHead

TEMPLATE_KEY = "tokenizer.chat_template.rerank"


@dataclass(frozen=True, slots=True)
class RankPrompt:
    ids: list[int]
    types: list[int] | None = None   # None: every token of type 0


class Reranker:
    """Scores of query-document prompts from one model with a classification head."""

    def __init__(self, model: Model, head: RankHead, tokenizer, template: str | None, n_ctx: int,
                 batch_tokens: int = PREFILL_BATCH):
        self.model, self.head, self.tokenizer, self.template = model, head, tokenizer, template
        self.embedder = Embedder(model, n_ctx, batch_tokens)

    @classmethod
    def from_file(cls, model: Model, f: GGUFFile, tokenizer, n_ctx: int) -> "Reranker":
        """The reranker of a loaded model; a LlogosError if its file has no classification head."""
        return cls(model, RankHead.from_gguf(f, model.cfg), tokenizer, f.meta.get(TEMPLATE_KEY), n_ctx)

    def pair(self, query: str, document: str) -> RankPrompt:
        tok = self.tokenizer
        if self.template is not None:
            text = self.template.replace("{query}", query).replace("{document}", document)
            return RankPrompt(tok.encode(text, add_bos=False))
        closing = tok.sep_id if tok.sep_id is not None else tok.eos_id if tok.add_eos else None
        end = [] if closing is None else [closing]
        first = ([tok.bos_id] if tok.add_bos else []) + tok.encode(query, add_bos=False, parse_special=False) + end
        second = tok.encode(document, add_bos=False, parse_special=False) + end
        types = [0] * len(first) + [1] * len(second) if self.model.cfg.n_token_types > 1 else None
        return RankPrompt(first + second, types)

    def text(self, text: str) -> RankPrompt:
        """One text scored alone (llama-embedding's line without a separator), with its special tokens."""
        return RankPrompt(prompt_ids(self.tokenizer, text))

    def scores(self, prompts: list[RankPrompt]) -> np.ndarray:
        """(N, n_labels): each prompt's head outputs; column 0 is its score."""
        pooling = "cls" if self.head.first_token else "last"
        states = self.embedder.embed([p.ids for p in prompts], EmbedOptions(pooling, -1), [p.types for p in prompts])
        return self.head.scores(np.stack(states))
