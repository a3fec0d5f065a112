"""Hugging Face Llama in and out (models/hf.py, runtime/hfckpt.py, `tidal import hf` / `tidal export hf`).

A small random LlamaForCausalLM is built with `transformers` locally (LlamaConfig, save_pretrained; no hub), tied and
untied, with GQA. Import then export is bit-exact (every tensor equal, same dtype); Tidal's forward on the imported
weights equals transformers' logits within 1e-5 in fp32 (single process)."""

import json

import pytest
import torch

from tidal.cli.main import main
from tidal.core.errors import TidalError

transformers = pytest.importorskip("transformers")
st = pytest.importorskip("safetensors.torch")


def make_hf(path, tied: bool, dtype=torch.float32, seed: int = 0):
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, rope_theta=50000.0,
                                   rms_norm_eps=1e-5, tie_word_embeddings=tied)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg).float()
    with torch.no_grad():  # HF initialises norms to ones: randomise everything so a swapped name cannot pass
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    model.to(dtype).save_pretrained(path)
    return model.float().eval()


def load_tidal(ckpt_dir):
    from tidal.core.model import ModelSpec, param_table
    from tidal.models.llama import Llama
    from tidal.runtime.checkpoint import load_meta, read_slice
    from tidal.runtime.hfckpt import checkpoint_path

    p = checkpoint_path(ckpt_dir)
    spec = ModelSpec(**load_meta(p)["model"])
    model = Llama(spec, attn_backend="sdpa", seed=0)
    named = dict(model.named_parameters())
    with torch.no_grad():
        for k, info in enumerate(param_table(spec)):
            named[info.name].copy_(read_slice(p, "params", k))
    return model.eval()


@pytest.mark.parametrize("tied", [False, True])
def test_import_export_round_trip_and_logits(tmp_path, tied, capsys):
    from tidal.models.llama import VarlenBatch

    src, ck, out = tmp_path / "hf", tmp_path / "ck", tmp_path / "out"
    ref = make_hf(src, tied)
    (src / "tokenizer.json").write_text('{"model": {"type": "BPE"}}')
    assert main(["import", "hf", str(src), "--out", str(ck)]) == 0
    assert main(["export", "hf", str(ck), "--out", str(out)]) == 0
    assert "with tokenizer.json" in capsys.readouterr().out
    a, b = st.load_file(str(src / "model.safetensors")), st.load_file(str(out / "model.safetensors"))
    a.pop("lm_head.weight", None) if tied else None
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    assert (out / "tokenizer.json").read_text() == (src / "tokenizer.json").read_text()
    # the exported directory loads in transformers and computes the same logits
    tokens = torch.randint(0, 96, (1, 23), generator=torch.Generator().manual_seed(1))
    back = transformers.LlamaForCausalLM.from_pretrained(out).float().eval()
    with torch.no_grad():
        want = ref(tokens).logits[0]
        assert torch.equal(back(tokens).logits[0], want)
        # Tidal's forward on the imported checkpoint: one packed document of 23 tokens, and two documents
        got = load_tidal(ck)(tokens[0], VarlenBatch.from_lengths([23]))
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
        two = load_tidal(ck)(tokens[0], VarlenBatch.from_lengths([10, 13]))
        torch.testing.assert_close(two[10:], ref(tokens[:, 10:]).logits[0], rtol=0, atol=1e-5)
    toml = (ck / "train.toml").read_text()
    assert "kv_heads = 2" in toml and f"tie_embeddings = {'true' if tied else 'false'}" in toml


def test_bf16_round_trip_is_bit_exact(tmp_path):
    from tidal.runtime.hfckpt import export_hf, import_hf

    make_hf(tmp_path / "hf", tied=False, dtype=torch.bfloat16)
    r = import_hf(tmp_path / "hf", tmp_path / "ck")
    assert r["dtype"] == "bfloat16"
    export_hf(tmp_path / "ck" / "step-000000", tmp_path / "out")
    a, b = st.load_file(str(tmp_path / "hf" / "model.safetensors")), st.load_file(str(tmp_path / "out" /
                                                                                        "model.safetensors"))
    assert all(b[k].dtype == torch.bfloat16 and torch.equal(a[k], b[k]) for k in a) and sorted(a) == sorted(b)


def test_import_refuses_what_it_cannot_run_exactly(tmp_path):
    from tidal.models.hf import spec_from_hf_config
    from tidal.runtime.hfckpt import import_hf

    make_hf(tmp_path / "hf", tied=False)
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    for change, words in (({"model_type": "qwen2"}, "q/k/v biases"), ({"attention_bias": True}, "no biases"),
                          ({"rope_scaling": {"rope_type": "llama3"}}, "rope_scaling"),
                          ({"sliding_window": 4096}, "sliding_window"), ({"head_dim": 16}, "head_dim"),
                          ({"hidden_act": "gelu"}, "SwiGLU"), ({"num_attention_heads": 5}, "divisible")):
        with pytest.raises(TidalError, match=words):
            spec_from_hf_config({**cfg, **change}, "x")
    cfg["num_hidden_layers"] = 3  # config.json promises a layer the weights lack
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(TidalError, match="no tensor for model.layers.2"):
        import_hf(tmp_path / "hf", tmp_path / "ck")
    assert main(["import", "hf", str(tmp_path / "nope"), "--out", str(tmp_path / "ck")]) == 2
