"""Hugging Face weights in (--init-from, sharded safetensors, per stage) and out (export):
transformers loads the export with logits within 1e-5 of ratrain's; HF -> 0 steps -> HF is
the identity."""

from __future__ import annotations

import pytest
import torch

from ratrain.checkpoint.read import read_model_weights
from ratrain.cli import main
from ratrain.models.hf_config import from_hf_config
from ratrain.nn.llama import LlamaModel

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

pytestmark = pytest.mark.dist
SMALL = ["--seq", "16", "--micro-batch", "1", "--global-batch", "4", "--quiet", "--threads", "1"]


def _hf_model(tmp_path, cls_cfg, cls_model, shard: str | None = None, **kw):
    cfg = cls_cfg(
        vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, **kw,
    )  # fmt: skip
    torch.manual_seed(0)
    model = cls_model(cfg).eval()
    with torch.no_grad():  # norms start at one and biases at zero: make every weight count
        for p in model.parameters():
            p.add_(torch.randn(p.shape) * 0.05)
    d = tmp_path / "hf"
    model.save_pretrained(d, max_shard_size=shard) if shard else model.save_pretrained(d)
    return d, model


def _hf_tensors(d) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(d.glob("*.safetensors")):
        out.update(safetensors_torch.load_file(str(f)))
    return out


@pytest.mark.timeout(240)
def test_sharded_hf_in_train_export_loads_in_transformers(tmp_path, capsys):
    src, _ = _hf_model(
        tmp_path, transformers.LlamaConfig, transformers.LlamaForCausalLM, shard="50KB",
        rope_theta=5e5,
    )  # fmt: skip
    assert (src / "model.safetensors.index.json").is_file()  # sharded, with an index
    save, out = tmp_path / "ck", tmp_path / "out"
    argv = ["train", "--init-from", str(src), "--pp", "2", "--steps", "2", "--save", str(save)]
    assert main([*argv, *SMALL]) == 0
    assert main(["export", str(save), "--hf", str(out)]) == 0
    capsys.readouterr()
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
    spec = from_hf_config(out)
    assert spec.rope_theta == 5e5
    ours = LlamaModel(spec, seed=None)
    ours.load_state_dict(read_model_weights(save / "step-00000002"), strict=True)
    tokens = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        diff = (ours(tokens) - hf.eval()(input_ids=tokens).logits).abs().max().item()
    assert diff <= 1e-5
    # It trained: the weights moved away from the imported ones.
    moved = read_model_weights(save / "step-00000002")["units.1.mlp.up_proj.weight"]
    assert not torch.equal(moved, _hf_tensors(src)["model.layers.0.mlp.up_proj.weight"])


@pytest.mark.timeout(240)
def test_hf_zero_steps_export_is_identity(tmp_path, capsys):
    src, _ = _hf_model(
        tmp_path, transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
        tie_word_embeddings=True, rope_theta=1e6,
    )  # fmt: skip
    save, out = tmp_path / "ck", tmp_path / "out"
    argv = ["train", "--init-from", str(src), "--pp", "1", "--steps", "0", "--save", str(save)]
    assert main([*argv, *SMALL]) == 0
    assert (save / "step-00000000").is_dir()
    assert main(["export", str(save), "--hf", str(out)]) == 0
    a, b = _hf_tensors(src), _hf_tensors(out)
    a.pop("lm_head.weight", None)  # tied: equal to the embedding whether stored or not
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert from_hf_config(out) == from_hf_config(src).__class__(
        **{**from_hf_config(src).to_dict(), "name": from_hf_config(out).name}
    )


def test_a_stage_reads_only_its_own_tensors(tmp_path, monkeypatch):
    import safetensors

    from ratrain.checkpoint import hf as hf_load
    from ratrain.config import Plan, TrainConfig
    from ratrain.runtime.stage import StageModel

    src, hf = _hf_model(tmp_path, transformers.LlamaConfig, transformers.LlamaForCausalLM)
    spec = from_hf_config(src)
    plan = Plan(pp=2, micro_batch=1, global_batch=2, seq=16, model=spec.name, compute_dtype="fp32")
    read: list[str] = []
    real_open = safetensors.safe_open

    class Recording:
        def __init__(self, *a, **kw):
            self.f = real_open(*a, **kw)

        def __enter__(self):
            self.f.__enter__()
            return self

        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

        def keys(self):
            return self.f.keys()

        def get_tensor(self, k):
            read.append(k)
            return self.f.get_tensor(k)

        def get_slice(self, k):
            read.append(k)
            return self.f.get_slice(k)

    monkeypatch.setattr(safetensors, "safe_open", Recording)
    model = StageModel(spec, plan, TrainConfig(steps=1), 1, 0, torch.device("cpu"))
    hf_load.load_stage_from_hf(model, src)
    # Stage 1 of 2 holds blocks 2-3 and the head: nothing of blocks 0-1 or the embedding.
    assert read and all(k.startswith(("model.layers.2.", "model.layers.3.", "model.norm",
                                      "lm_head")) for k in read), read  # fmt: skip
    sd = hf.state_dict()
    assert torch.equal(
        model.units[3].module.mlp.up_proj.weight, sd["model.layers.2.mlp.up_proj.weight"]
    )
