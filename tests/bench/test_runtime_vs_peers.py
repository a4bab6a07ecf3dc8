"""benchmarks/peers.py's chunks for torch's multi-stage schedules (2·pp chunks, two per
rank) and runtime_vs_peers.py's first-step loss check; no ranks are started here."""

import importlib.util
import sys
from pathlib import Path

import pytest

from ratrain.config import Plan, even_split
from ratrain.models.spec import ModelSpec

_BENCH = Path(__file__).parents[2] / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, _BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # runtime_vs_peers imports peers by name
    spec.loader.exec_module(mod)
    return mod


peers = _load("peers")
bench = _load("runtime_vs_peers")

SPEC = ModelSpec("t8", 8, 64, 4, 4, 128, 256, max_seq=32)


def _plan(pp: int, split=None) -> Plan:
    return Plan(pp=pp, dp=1, micro_batch=1, global_batch=8, seq=32, layer_split=split)


def _check_cover(split, n_chunks):
    units = peers.chunk_units(SPEC, split)
    assert len(units) == n_chunks
    flat = [u for r in units for u in r]
    assert flat == list(range(SPEC.n_layers + 2))  # every unit once, in order
    assert units[0][0] == 0 and units[-1][-1] == SPEC.n_layers + 1
    assert all(len(r) >= 1 for r in units)


@pytest.mark.parametrize("style", ["loop", "v"])
@pytest.mark.parametrize("pp", [2, 3, 4])
def test_even_chunks_cover_the_units_in_order_once(pp, style):
    split = peers.chunk_split(SPEC, _plan(pp), style)
    assert split == even_split(SPEC.n_layers, 2 * pp)
    _check_cover(split, 2 * pp)


@pytest.mark.parametrize("style", ["loop", "v"])
@pytest.mark.parametrize("per_rank", [(5, 3), (3, 5), (2, 4, 2), (1, 3, 3, 1)])
def test_a_given_split_keeps_every_ranks_blocks(per_rank, style):
    pp = len(per_rank)
    try:
        split = peers.chunk_split(SPEC, _plan(pp, per_rank), style)
    except ValueError as e:  # 1,3,3,1 in a V: rank 0's one block, chunks 0 and 7
        assert (per_rank, style) == ((1, 3, 3, 1), "v") and "cannot be cut" in str(e)
        return
    _check_cover(split, 2 * pp)
    for rank, blocks in enumerate(per_rank):
        assert sum(split[c] for c in peers.rank_chunks(pp, rank, style)) == blocks
    assert all(n >= 1 for n in split[1:-1])


def test_chunk_placement():
    assert peers.rank_chunks(4, 1, None) == (1,)
    assert peers.rank_chunks(4, 1, "loop") == (1, 5)
    assert peers.rank_chunks(4, 1, "v") == (1, 6)
    assert peers.chunk_split(SPEC, _plan(2, (5, 3)), "loop") == (2, 2, 3, 1)
    assert peers.chunk_split(SPEC, _plan(2, (5, 3)), "v") == (3, 2, 1, 2)


def test_too_many_chunks_is_one_line():
    with pytest.raises(ValueError, match="cannot be split into 10 chunks"):
        peers.chunk_split(SPEC, _plan(5), "loop")


def test_a_peer_with_another_first_step_loss_is_wrong():
    runs = {
        "torch-1f1b": [{"loss": 5.0}],
        "torch-zbv": [{"loss": 5.0 * (1 + 1e-7)}],
        "torch-izb": [{"loss": 5.1}],
        "torch-dualpipev@5,3": [{"loss": None}],
        "deepspeed": [{"loss": None}],
    }
    assert set(bench.check_losses(runs)) == {"torch-izb", "torch-dualpipev@5,3"}


def _bench_args(systems: str, steps: int, repeats: int):
    """runtime_vs_peers' arguments for a tiny layout, no ranks' profile."""
    return bench.argparse.Namespace(
        micro_batch=1,
        microbatches=8,
        seq=32,
        steps=steps,
        warmup=1,
        repeats=repeats,
        layer_split="even",
        ratrain_split="same",
        split_platform="cpu-local",
        peers_on_ratrain_split=True,
        systems=systems,
        loss_chunk_tokens=0,
        compile=False,
        profile=False,
        platform="cpu-local",
        probe_seconds=0.1,
        malloc_mmap_threshold=0,
    )


def test_a_refused_ratrain_zb_is_skipped_with_its_line(monkeypatch, capsys):
    line = "pipeline zb-h1 is not yet executed by the runtime; use pipeline 1f1b"

    def refuse(spec, plan, *a, **kw):
        assert plan.pipeline == "zb-h1"
        raise bench.RatrainError(line)

    monkeypatch.setattr(bench, "run_ratrain", refuse)
    a = _bench_args(systems="ratrain-zb", steps=2, repeats=2)
    res = bench.bench_layout(a, SPEC, 2, 1)
    assert res["skipped"] == {"ratrain-zb": line} and res["rows"] == {}
    bench.print_layout("pp=2", res, 1)
    assert f"skipped: {line}" in capsys.readouterr().out


@pytest.mark.parametrize("pp, dp", [(2, 1), (1, 2)])
def test_the_ceiling_runs_the_jobs_microbatches_once_over_the_ranks(pp, dp):
    """The bubble-free ceiling does the job's work: its ranks' first-step losses, each the
    mean over its share of the microbatches, average to torch-1f1b's (the same weights and
    data), and every rank ran steps."""
    import functools

    from ratrain.config import TrainConfig
    from ratrain.data import make_source
    from ratrain.launch.spawn import spawn

    plan = Plan(pp=pp, dp=dp, micro_batch=1, global_batch=8, seq=32)
    cfg = TrainConfig(steps=2, warmup_steps=1)
    source = functools.partial(make_source, "synthetic", SPEC, plan.seq, cfg.seed)
    ceiling = spawn(peers.ceiling_rank, 2, SPEC, plan, cfg, source, deadline_s=120)
    ref = spawn(peers.torch_1f1b_rank, 2, SPEC, plan, cfg, source, deadline_s=120)
    ref_loss = sum(r["loss"] for r in ref if r["loss"] is not None) / dp
    first = [r["losses"][0] for r in ceiling]
    assert abs(sum(first) / len(first) - ref_loss) <= 1e-5 * abs(ref_loss)
    assert all(len(r["times"]) == cfg.steps for r in ceiling)


def test_each_system_is_reported_as_its_share_of_the_ceiling(monkeypatch, capsys):
    speeds = {"ceiling": [2.0, 4.0, 2.0], "torch-1f1b": [1.0, 1.0, 1.5]}  # steps/s

    def fake_peer(system, spec, plan, *a, **kw):
        rate = speeds[system][len(calls[system])]
        calls[system].append(rate)
        return {
            "times": [1 / rate] * 3,
            "rss": {0: 1, 1: 1},
            "profile": {},
            "compile_s": {},
            "loss": None,
        }

    calls = {s: [] for s in speeds}
    monkeypatch.setattr(bench, "run_peer", fake_peer)
    a = _bench_args(systems="ceiling,torch-1f1b", steps=3, repeats=3)
    res = bench.bench_layout(a, SPEC, 2, 1)
    q = res["ratios"]
    assert q["share_of_ceiling_per_repeat"] == {"torch-1f1b": [0.5, 0.25, 0.75]}
    assert q["share_of_ceiling"] == {"torch-1f1b": 0.5}
    assert q.get("peers") is None  # the ceiling is not a peer: no ratrain, no comparison
    bench.print_layout("pp=2", res, 1)
    assert "torch-1f1b                 0.500 (0.500 0.250 0.750)" in capsys.readouterr().out
