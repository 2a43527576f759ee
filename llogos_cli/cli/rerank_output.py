"""`llogos embed --pooling rank`: each line's query and document scored by a reranker, printed as
llama-embedding prints them ("rerank score i: s", a line a label where the head has several)."""

import json
import sys

from llogos_cli.engine.rerank import TEMPLATE_KEY, Reranker
from llogos_cli.errors import LlogosError
from llogos_cli.model.rank_head import RankHead


def rerank_lines(model, mf, n_ctx: int, texts: list[str], separator: str, as_json: bool) -> None:
    """model: the LoadOptions; mf: its opened file. A line without the separator is scored alone."""
    for i, text in enumerate(texts):
        if text.count(separator) > 1:
            raise LlogosError(f"line {i + 1} has {text.count(separator) + 1} parts: give a query and a document, "
                              f"separated by {separator!r} (--cls-separator)")
    head = RankHead.from_gguf(mf.file, mf.cfg)   # a model without one is refused before its weights load
    reranker = Reranker(model.load(mf, n_ctx).model, head, mf.tokenizer, mf.file.meta.get(TEMPLATE_KEY), n_ctx)
    prompts = [reranker.pair(*text.split(separator)) if separator in text else reranker.text(text) for text in texts]
    labels = reranker.head.labels
    for index, outputs in enumerate(reranker.scores(prompts)):
        if as_json:
            extra = {"scores": dict(zip(labels, map(float, outputs)))} if len(labels) > 1 else {}
            sys.stdout.write(json.dumps({"index": index, "score": float(outputs[0])} | extra) + "\n")
        elif len(labels) == 1:
            sys.stdout.write(f"rerank score {index}: {outputs[0]:8.3f}\n")
        else:
            sys.stdout.write("".join(f"rerank score {index}: {v:8.3f} [{label}]\n" for v, label in zip(outputs, labels)))
