"""The CPU benchmark's synthetic GGUFs (bench/synthetic_gguf.py): a mixture-of-experts shape is
written with its experts stacked, in its type mix, and loads and runs like a real file."""

import dataclasses

import numpy as np
from gguf import GGMLQuantizationType as QType

from bench import synthetic, synthetic_gguf
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.model.batch import Batch
from llogos_cli.model.loader import load


def test_a_mixture_of_experts_shape_loads_and_runs(tmp_path, monkeypatch):
    spec = dataclasses.replace(synthetic.SPECS["qwen3-30b-a3b"], name="tiny-moe", n_layer=3, n_vocab=500, n_embd=256,
                               n_head=4, n_kv=2, head_dim=64, n_ff=256, experts=synthetic.Experts(8, 2, 256))
    monkeypatch.setitem(synthetic.SPECS, "tiny-moe", spec)
    path = synthetic_gguf.write_model("tiny-moe", tmp_path)
    f = GGUFFile(path)
    assert f.arch == "qwen3moe" and f.tensors["blk.1.ffn_up_exps.weight"].shape[0] == 8
    types = {name: info.ggml_type for name, info in f.tensors.items()}
    assert types["blk.1.ffn_up_exps.weight"] == QType.Q3_K and types["blk.0.ffn_down_exps.weight"] == QType.Q4_K
    assert types["blk.2.ffn_down_exps.weight"] == QType.Q5_K   # the last eighth of the layers: more bits
    assert types["blk.1.attn_output.weight"] == QType.Q4_K and types["output.weight"] == QType.Q6_K
    model = load(path, "cpu", "auto", n_ctx=32).model
    assert (model.cfg.n_expert, model.cfg.n_expert_used, model.cfg.n_ff_exp) == (8, 2, 256)
    logits = model.forward(model.new_cache(1, 32), Batch.run(np.arange(5, 15), 0, 0, [9]))
    assert logits.shape == (1, 500) and np.all(np.isfinite(logits))


def test_a_gpt_oss_shape_loads_and_runs(tmp_path, monkeypatch):
    """gpt-oss's shape as it ships (experts MXFP4, the other matrices Q8_0, biases, sinks, windows,
    YaRN): the tensors and keys its family needs, so that llogos (and llama.cpp) load it."""
    spec = dataclasses.replace(synthetic.SPECS["gpt-oss-20b"], name="tiny-oss", n_layer=2, n_vocab=500, n_embd=256,
                               n_head=4, n_kv=2, head_dim=64, n_ff=256, experts=synthetic.Experts(8, 2, 256),
                               sliding_window=16)
    monkeypatch.setitem(synthetic.SPECS, "tiny-oss", spec)
    path = synthetic_gguf.write_model("tiny-oss", tmp_path)
    f = GGUFFile(path)
    assert f.arch == "gpt-oss" and f.tensors["blk.1.ffn_down_exps.bias"].shape == (8, 256)
    types = {name: info.ggml_type for name, info in f.tensors.items()}
    assert types["blk.1.ffn_up_exps.weight"] == QType.MXFP4 and types["blk.0.attn_q.weight"] == QType.Q8_0
    assert types["output.weight"] == types["token_embd.weight"] == QType.Q8_0
    model = load(path, "cpu", "quantized", n_ctx=64).model
    cfg = model.cfg
    assert (cfg.n_expert, cfg.n_expert_used, cfg.n_ff_exp) == (8, 2, 256)
    logits = model.forward(model.new_cache(1, 64), Batch.run(np.arange(5, 45), 0, 0, [39]))
    assert logits.shape == (1, 500) and np.all(np.isfinite(logits))


def test_a_shape_in_another_type_mix(tmp_path, monkeypatch):
    """bench_quant's SHAPE:MIX: llama-1b's shape in llama.cpp's IQ4_XS mix (every matrix IQ4_XS,
    the tied table Q6_K), named after the mix, loads and runs."""
    spec = dataclasses.replace(synthetic.SPECS["llama-1b"], name="tiny-llama", n_layer=2, n_vocab=500, n_embd=256,
                               n_head=4, n_kv=2, n_ff=512)
    monkeypatch.setitem(synthetic.SPECS, "tiny-llama", spec)
    path = synthetic_gguf.write_model("tiny-llama", tmp_path, "iq4_xs")
    assert path.name == "tiny-llama-iq4_xs.gguf"
    types = {info.ggml_type for name, info in GGUFFile(path).tensors.items() if len(info.shape) == 2}
    assert types == {QType.IQ4_XS, QType.Q6_K}
    model = load(path, "cpu", "auto", n_ctx=32).model
    logits = model.forward(model.new_cache(1, 32), Batch.run(np.arange(5, 15), 0, 0, [9]))
    assert logits.shape == (1, 500) and np.all(np.isfinite(logits))
