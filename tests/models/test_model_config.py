"""`[model]` shapes: presets, presets with keys changed, custom Llama-family shapes, each refused with one line when
they cannot run; a custom shape trains from an imported Hugging Face checkpoint and passes `tidal verify`."""

import json

import pytest

from tidal.cli.main import main
from tidal.core.errors import TidalError
from tidal.core.model import MODEL_PRESETS, get_model
from tidal.runtime.config import ModelConfig, config_from_dict, model_arg


def test_published_presets():
    m, q = get_model("mistral-7b"), get_model("qwen2.5-7b")
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.ffn, m.vocab, m.rope_theta) == \
        (32, 4096, 32, 8, 14336, 32768, 1e6)
    assert (q.layers, q.hidden, q.heads, q.kv_heads, q.ffn, q.vocab, q.norm_eps) == \
        (28, 3584, 28, 4, 18944, 152064, 1e-6)
    assert 7.0e9 < m.num_params() < 7.5e9 and 7.0e9 < q.num_params() - 3 * 3584 * 28 < 7.7e9


def test_custom_shape_and_preset_changes():
    cfg = config_from_dict({"model": {"name": "mine", "layers": 2, "hidden": 48, "heads": 6, "kv_heads": 2,
                                      "ffn": 80, "vocab": 300, "rope_theta": 20000, "tie_embeddings": True}})
    s = cfg.model.spec()
    assert (s.name, s.layers, s.head_dim, s.kv_dim, s.rope_theta, s.tie_embeddings, s.norm_eps) == \
        ("mine", 2, 8, 16, 20000.0, True, 1e-5)
    s = ModelConfig("llama3-8b", layers=2).spec()
    assert s.layers == 2 and s.vocab == 128256 and s.name == "llama3-8b(layers=2)"
    assert ModelConfig("tiny").spec() is MODEL_PRESETS["tiny"]


@pytest.mark.parametrize("model, words", [
    ({"name": "mine", "layers": 2, "hidden": 48}, "needs heads, kv_heads, ffn, vocab"),
    ({"name": "mine", "layers": 2, "hidden": 48, "heads": 5, "kv_heads": 1, "ffn": 8, "vocab": 9}, "divisible"),
    ({"name": "tiny", "heads": 16, "kv_heads": 3}, "not divisible by kv_heads"),
    ({"name": "tiny", "hidden": 48, "heads": 16, "kv_heads": 4}, "must be even"),
    ({"name": "tiny", "layers": 0}, "layers must be >= 1"),
    ({"name": "tiny", "rope_theta": -1.0}, "rope_theta must be in \\(0, inf\\)"),
    ({"name": "tiny", "norm_eps": float("inf")}, "norm_eps must be a finite number"),
    ({"name": "tiny", "layers": 2.5}, "expected int"),
    ({"name": "tiny", "tie_embeddings": 1}, "expected bool"),
    ({"name": "nope"}, "unknown model preset"),
])
def test_bad_shapes_are_one_line_errors(model, words):
    with pytest.raises(TidalError, match=words) as e:
        config_from_dict({"model": model}).model.spec()
    assert "\n" not in str(e.value)


def test_model_arg_reads_a_toml_section(tmp_path):
    f = tmp_path / "m.toml"
    f.write_text('[model]\nname = "x"\nlayers = 2\nhidden = 32\nheads = 4\nkv_heads = 2\nffn = 40\nvocab = 256\n')
    assert model_arg(str(f)).spec().kv_heads == 2 and model_arg("tiny").name == "tiny"
    f.write_text("[data]\n")
    with pytest.raises(TidalError, match="no \\[model\\] section"):
        model_arg(str(f))


@pytest.mark.distributed
def test_imported_custom_shape_trains_and_verifies(tmp_path, capsys):
    """A custom shape (GQA, tied, 3 layers) imported from a random HF Llama resumes training at step 0 from its
    weights on 2 ranks (its first loss is far above a fresh initialisation's ln(vocab)), and `tidal verify` accepts
    the shape (fp64, TP2 and DP2 against one process)."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("safetensors")
    import torch

    hf = tmp_path / "hf"
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=48, intermediate_size=80, num_hidden_layers=3,
                                   num_attention_heads=6, num_key_value_heads=2, rope_theta=20000.0,
                                   rms_norm_eps=1e-5, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():  # far from a fresh initialisation: large random weights give a large first loss
        for p in model.parameters():
            p.normal_(0.0, 0.3)
        model.model.norm.weight.fill_(5.0)  # logits of std ~10
    model.save_pretrained(hf)
    ck = tmp_path / "ck"
    assert main(["import", "hf", str(hf), "--out", str(ck)]) == 0
    toml = (ck / "train.toml").read_text()
    toml = toml.replace("[train]\n", f'[train]\nsteps = 2\nprogress = false\nmetrics = "{tmp_path / "m.jsonl"}"\n')
    toml = toml.replace('name = "hf"\n', 'name = "hf"\nattn_backend = "sdpa"\n')
    toml += '[world]\ncluster = "cpux2"\n[data]\nsource = "random:synthetic:github"\nmax_len = 64\n' \
            'tokens_per_step = 256\n[planner]\nstrategies = "tp2;2*tp1"\n'
    (tmp_path / "train.toml").write_text(toml)
    assert main(["train", "--config", str(tmp_path / "train.toml"), "--nproc", "2"]) == 0
    rows = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1] and all(r["loss"] == r["loss"] for r in rows)
    # a fresh initialisation (std 0.02) gives near-uniform logits, loss ~ ln(256) = 5.55; the imported weights do not
    assert rows[0]["loss"] > 8.0, rows[0]["loss"]
    assert (ck / "step-000002" / "manifest.json").is_file()  # the run checkpointed into the imported directory
    capsys.readouterr()
    assert main(["verify", "--model", str(ck / "train.toml"), "--nproc", "2", "--strategies", "tp2;2*tp1",
                 "--steps", "2", "--max-len", "64", "--tokens-per-step", "256"]) == 0
    assert "PASS" in capsys.readouterr().out
