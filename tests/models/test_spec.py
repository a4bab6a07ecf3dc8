import json

import pytest

from _hf import hf_config_and_class
from ratrain.config import Plan, even_split
from ratrain.errors import RatrainError
from ratrain.models.counts import block_params, total_params, unit_fwd_flops, unit_params
from ratrain.models.hf_config import from_hf_config
from ratrain.models.presets import PRESETS, get_preset, resolve_model
from ratrain.models.spec import ModelSpec


def test_llama2_param_counts_exact():
    assert total_params(get_preset("llama2-7b")) == 6_738_415_616
    assert total_params(get_preset("llama2-70b")) == 68_976_648_192


@pytest.mark.parametrize(
    "name", [n for n, s in PRESETS.items() if s.position == "rope" and not s.normalized_head]
)
def test_preset_params_match_transformers_meta(name):
    torch = pytest.importorskip("torch")
    spec = PRESETS[name]
    cfg, cls = hf_config_and_class(spec)
    with torch.device("meta"):
        model = cls(cfg)
    assert total_params(spec) == sum(p.numel() for p in model.parameters())


def test_tied_counts_embedding_once():
    s = get_preset("tiny-tied")
    assert (
        total_params(s)
        == sum(unit_params(s, u) for u in range(s.n_layers + 2)) - s.vocab * s.hidden
    )


def test_flops_scale():
    s = get_preset("llama2-7b")
    # 2 FLOPs per weight per token plus attention core 4 b s^2 h
    assert (
        unit_fwd_flops(s, 1, 1, 4096)
        == 2 * 4096 * (block_params(s) - 2 * s.hidden) + 4 * 4096**2 * s.hidden
    )
    assert unit_fwd_flops(s, 0, 1, 4096) == 0


@pytest.mark.parametrize(
    "kw, msg",
    [
        (dict(hidden=100, n_heads=3), "heads"),
        (dict(n_heads=4, n_kv_heads=3), "kv heads"),
        (dict(n_layers=0), "positive"),
        (dict(vocab=-5), "positive"),
        (dict(position="learned"), "position"),
    ],
)
def test_spec_validation(kw, msg):
    base = dict(name="x", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=100)
    base.update(kw)
    with pytest.raises(RatrainError, match=msg):
        ModelSpec(**base)


def test_unknown_preset():
    with pytest.raises(RatrainError, match="unknown model preset"):
        get_preset("gpt5")


def test_hf_config_roundtrip(tmp_path):
    cfg = {
        "model_type": "qwen2",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 100,
        "rope_theta": 1e6,
    }
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    s = resolve_model(str(p))
    assert s.qkv_bias and s.n_kv_heads == 2 and s.rope_theta == 1e6


@pytest.mark.parametrize(
    "content, msg",
    [
        ("{not json", "not valid JSON"),
        (json.dumps({"model_type": "gpt2"}), "not supported"),
        (json.dumps({"model_type": "llama", "hidden_size": 64}), "missing required"),
        (
            json.dumps(
                {
                    "model_type": "llama",
                    "num_hidden_layers": 2,
                    "hidden_size": 64,
                    "num_attention_heads": 3,
                    "intermediate_size": 8,
                    "vocab_size": 10,
                }
            ),
            "heads",
        ),
    ],
)
def test_bad_hf_config(tmp_path, content, msg):
    p = tmp_path / "config.json"
    p.write_text(content)
    with pytest.raises(RatrainError, match=msg):
        from_hf_config(p)


def test_missing_hf_config(tmp_path):
    with pytest.raises(RatrainError, match="not found"):
        from_hf_config(tmp_path / "nope.json")


def test_plan_units_and_split():
    spec = get_preset("llama2-7b")
    assert even_split(32, 5) == (6, 7, 7, 6, 6) or sum(even_split(32, 5)) == 32
    plan = Plan(pp=4, dp=2, micro_batch=1, global_batch=16, seq=4096)
    assert plan.microbatches == 8
    units = [list(plan.stage_units(spec, s)) for s in range(4)]
    assert units[0][0] == 0 and units[-1][-1] == 33
    assert sorted(u for us in units for u in us) == list(range(34))
    with pytest.raises(RatrainError, match="multiple"):
        Plan(dp=3, global_batch=4)
    with pytest.raises(RatrainError, match="sums to"):
        Plan(pp=2, layer_split=(1, 1)).blocks_per_stage(spec)
    p = Plan(pp=2, layer_split=(16, 16), recompute="first:3")
    assert p.recompute_of(spec, 0, 3) == "full" and p.recompute_of(spec, 0, 4) == "none"
    assert p.recompute_of(spec, 1, 17) == "full" and p.recompute_of(spec, 1, 20) == "none"
    assert Plan.from_dict(p.to_dict()) == p
