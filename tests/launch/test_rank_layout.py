"""Rank placement is part of the plan: `Plan.rank_layout` (pp-inner | dp-inner) validates and
round-trips through plan files and flags, places the runtime's ranks by the one
`rank_of` the cost model uses, gives the same numbers either way, is what `simulate`
costs, and is searched by the planner where the platform's nodes make it matter."""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys

import pytest
import torch
import yaml

import _runtime as harness
from _cli import one_line_error
from ratrain import ranks
from ratrain.cli import main
from ratrain.config import RANK_LAYOUTS, Plan, TrainConfig, load_plan, save_plan
from ratrain.cost import comm
from ratrain.errors import RatrainError
from ratrain.launch.emulate import unavailable
from ratrain.launch.grid import ParallelGrid, rank_layout
from ratrain.models.presets import get_preset
from ratrain.planner.search import search
from ratrain.planner.space import Request, family_of, knob_combos, structures
from ratrain.platforms.load import load
from ratrain.sim import simulate

SPEC = get_preset("tiny")


def _platform_yaml(tmp_path, units_per_node: int) -> str:
    """mt3000 with `units_per_node` ranks a node and a 100x slower link between nodes."""
    from importlib.resources import files

    data = yaml.safe_load(files("ratrain.platforms").joinpath("mt3000.yaml").read_text())
    data["name"] = f"mt3000-{units_per_node}pn-slow"
    data["network"]["units_per_node"]["value"] = units_per_node
    data["network"]["inter_node"]["bandwidth_bytes_per_s"]["value"] = 6.25e7
    path = tmp_path / f"pf{units_per_node}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


# -- the field -------------------------------------------------------------------------------


def test_field_validates_and_round_trips(tmp_path):
    assert Plan().rank_layout == "pp-inner" and RANK_LAYOUTS == ("pp-inner", "dp-inner")
    with pytest.raises(RatrainError) as e:
        Plan(rank_layout="zigzag")
    assert str(e.value) == "plan: rank_layout must be one of pp-inner, dp-inner, got 'zigzag'"
    names = [f.name for f in dataclasses.fields(Plan)]
    assert names.index("rank_layout") == names.index("pipeline") + 1
    plan = Plan(pp=2, dp=2, global_batch=4, rank_layout="dp-inner", model="tiny")
    assert Plan.from_dict(plan.to_dict()) == plan
    for suffix in ("yaml", "json"):
        save_plan(plan, tmp_path / f"p.{suffix}", platform="mt3000")
        assert load_plan(tmp_path / f"p.{suffix}")[0] == plan
    old = plan.to_dict()
    del old["rank_layout"]  # a plan file from before the field: pp-inner
    assert Plan.from_dict(old).rank_layout == "pp-inner"


def test_flag_overrides_the_plan_file_and_bad_values_are_one_line(tmp_path, capsys):
    from ratrain.cli.common import add_plan_args, plan_from_args

    save_plan(Plan(pp=2, dp=2, global_batch=4, model="tiny"), tmp_path / "p.yaml")
    p = argparse.ArgumentParser()
    add_plan_args(p)
    args = p.parse_args(["--plan", str(tmp_path / "p.yaml"), "--rank-layout", "dp-inner"])
    assert plan_from_args(args)[1].rank_layout == "dp-inner"
    assert "--rank-layout dp-inner overrides the plan file's pp-inner" in capsys.readouterr().err
    for cmd in ("simulate", "train", "verify"):
        assert main([cmd, "--rank-layout", "zigzag"]) == 2
        err = capsys.readouterr().err
        assert "argument --rank-layout: invalid choice" in err and "Traceback" not in err
    (tmp_path / "bad.yaml").write_text("plan: {rank_layout: zigzag}\n")
    one_line_error(capsys, ["simulate", "--plan", str(tmp_path / "bad.yaml")], "rank_layout")


# -- the grid --------------------------------------------------------------------------------


def test_grid_places_ranks_by_the_cost_models_rank_of():
    assert comm.rank_of is ranks.rank_of and comm.RANK_LAYOUTS is ranks.RANK_LAYOUTS
    assert rank_layout(2, 3) == [[0, 1], [2, 3], [4, 5]]
    assert rank_layout(2, 3, "dp-inner") == [[0, 3], [1, 4], [2, 5]]
    cpu = torch.device("cpu")
    for pp, dp in ((1, 4), (2, 2), (2, 3), (3, 2), (4, 1)):
        for layout in RANK_LAYOUTS:
            for rank in range(pp * dp):
                g = ParallelGrid(pp, dp, rank, pp * dp, cpu, layout)
                assert comm.rank_of(g.stage, g.replica, pp, dp, layout) == rank
                for s in range(pp):
                    for r in range(dp):
                        assert g.rank_of(s, r) == comm.rank_of(s, r, pp, dp, layout)
                assert g.dp_ranks == [comm.rank_of(g.stage, r, pp, dp, layout) for r in range(dp)]
                if not g.is_last_stage:
                    assert g.next_rank == comm.rank_of(g.stage + 1, g.replica, pp, dp, layout)
    g = ParallelGrid(2, 2, 1, 4, cpu, "dp-inner")
    assert (g.stage, g.replica, g.next_rank, g.dp_ranks) == (0, 1, 3, [0, 1])
    with pytest.raises(RatrainError, match="rank layout must be one of pp-inner, dp-inner"):
        ParallelGrid(2, 2, 0, 4, cpu, "zigzag")


def test_a_checkpoint_hands_each_stage_and_replica_its_own_rng_state():
    from ratrain.checkpoint.io import _rng_key

    g = ParallelGrid(2, 2, 1, 4, torch.device("cpu"), "dp-inner")  # stage 0, replica 1
    saved = {"world_size": 4, "plan": {"pp": 2, "dp": 2}}  # before the field: pp-inner
    assert _rng_key(saved, g) == "rng/rank2"
    saved["plan"]["rank_layout"] = "dp-inner"
    assert _rng_key(saved, g) == "rng/rank1"
    assert _rng_key({"world_size": 4, "plan": {"pp": 4, "dp": 1}}, g) == "rng/rank1"
    assert _rng_key({"world_size": 2, "plan": {"pp": 2, "dp": 1}}, g) is None


PLAN22 = Plan(pp=2, dp=2, micro_batch=1, global_batch=4, seq=16, compute_dtype="fp32", model="tiny")
CFG = TrainConfig(steps=3, warmup_steps=1)


@pytest.mark.dist
@pytest.mark.timeout(120)
def test_dp_inner_trains_bit_identical_to_pp_inner_on_local_gloo():
    runs = {}
    for layout in RANK_LAYOUTS:
        plan = PLAN22.replace(rank_layout=layout)
        res = harness.run(SPEC, plan, CFG, [("ratrain", {})], timeout_s=60, deadline_s=100)
        runs[layout] = harness.losses(res, "ratrain")
        placed = {r.rank: (r.stage, r.replica) for r in res}
        assert placed == {ranks.rank_of(s, r, 2, 2, layout): (s, r) for s in (0, 1) for r in (0, 1)}
    assert len(runs["pp-inner"]) == CFG.steps
    assert runs["dp-inner"] == runs["pp-inner"]  # bit for bit


# -- the simulator and the planner -----------------------------------------------------------


def test_simulate_costs_the_plans_layout(tmp_path, capsys):
    pf = _platform_yaml(tmp_path, 2)
    plan = Plan(pp=2, dp=2, global_batch=16, seq=128, compute_dtype="fp16", model="tiny")
    times = {
        lay: simulate(SPEC, plan.replace(rank_layout=lay), pf).step_time_s for lay in RANK_LAYOUTS
    }
    assert times["dp-inner"] < times["pp-inner"]  # the gradient syncs stay in a node
    assert simulate(SPEC, plan, pf, rank_layout="dp-inner").step_time_s == times["dp-inner"]
    save_plan(plan.replace(rank_layout="dp-inner"), tmp_path / "p.yaml", platform=pf)
    for argv in (
        ["--plan", str(tmp_path / "p.yaml")],
        ["--plan", str(tmp_path / "p.yaml"), "--platform", pf],
    ):
        assert main(["simulate", *argv, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["plan"]["rank_layout"] == "dp-inner" and out["step_time_s"] == times["dp-inner"]
    flags = ["simulate", "--model", "tiny", "--platform", pf, "--pp", "2", "--dp", "2"]
    flags += ["--global-batch", "16", "--seq", "128", "--dtype", "fp16", "--recompute", "none"]
    assert main([*flags, "--rank-layout", "dp-inner", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time_s"] == times["dp-inner"]


def _request(pf: str, **pins) -> Request:
    return Request(SPEC, load(pf), 4, 16, 128, pins=pins)


@pytest.mark.timeout(120)
def test_planner_picks_the_faster_layout_across_nodes_and_pp_inner_on_one(tmp_path):
    two, one = _platform_yaml(tmp_path, 2), _platform_yaml(tmp_path, 4)
    res = search(_request(two, pp=2, dp=2, micro_batch=1))
    best = res.best.plan
    assert best.rank_layout == "dp-inner"
    other = simulate(SPEC, best.replace(rank_layout="pp-inner"), two).step_time_s
    assert res.best.step_time_s < other  # the simulator says dp-inner is faster
    res1 = search(_request(one, pp=2, dp=2, micro_batch=1))
    assert res1.best.plan.rank_layout == "pp-inner"
    # one node: the layouts cost the same, so only pp-inner is searched (no doubling)
    fam = family_of("ratrain")
    for pf in (one, two):
        req = _request(pf)
        for st in structures(req, fam):
            got = {kn.rank_layout for kn in knob_combos(req, fam, st)}
            wide = st.pp > 1 and st.dp > 1 and pf == two
            assert got == (set(RANK_LAYOUTS) if wide else {"pp-inner"}), (st, got)
    assert res1.candidates_simulated <= res.candidates_simulated


def test_plan_output_records_the_layout_and_the_memory_cap(tmp_path, capsys):
    pf, out = _platform_yaml(tmp_path, 2), tmp_path / "plan.yaml"
    argv = ["plan", "--model", "tiny", "--platform", pf, "--clusters", "4"]
    argv += [
        "--global-batch",
        "16",
        "--seq",
        "128",
        "--pin",
        "pp=2",
        "--pin",
        "dp=2",
        "--pin",
        "micro_batch=1",
    ]
    assert main([*argv, "--memory-cap", "30", "-o", str(out)]) == 0
    capsys.readouterr()
    data = yaml.safe_load(out.read_text())
    assert data["plan"]["rank_layout"] == "dp-inner" and data["memory_cap_gib"] == 30
    plan, extras = load_plan(out)
    assert plan.rank_layout == "dp-inner" and extras["memory_cap_gib"] == 30
    assert main([*argv, "-o", str(out)]) == 0  # no cap given: none recorded
    assert "memory_cap_gib" not in yaml.safe_load(out.read_text())


@pytest.mark.timeout(120)
def test_train_holds_a_plan_to_the_cap_it_was_planned_for(tmp_path, capsys):
    plan = Plan(pp=2, micro_batch=2, global_batch=4, seq=16, compute_dtype="fp32", model="tiny")
    save_plan(plan, tmp_path / "p.yaml", memory_cap_gib=0.001)
    argv = ["train", "--plan", str(tmp_path / "p.yaml"), "--steps", "1", "--quiet"]
    err = one_line_error(capsys, argv, "plan does not fit", "was planned for")
    assert "--memory-cap overrides it" in err
    assert main([*argv, "--memory-cap", "1"]) == 0
    captured = capsys.readouterr()
    assert "--memory-cap 1 overrides the plan file's 0.001 GiB" in captured.err
    save_plan(plan, tmp_path / "bad.yaml", memory_cap_gib="lots")
    one_line_error(capsys, ["train", "--plan", str(tmp_path / "bad.yaml")], "memory_cap_gib")


# -- the emulated network --------------------------------------------------------------------

WHY = unavailable()
TRAIN = [
    "train",
    "--pp", "2",
    "--dp", "2",
    "--seq", "16",
    "--micro-batch", "2",
    "--global-batch", "8",
    "--steps", "2",
    "--dtype", "fp32",
    "--quiet",
]  # fmt: skip


@pytest.mark.dist
@pytest.mark.timeout(120)
@pytest.mark.skipif(WHY is not None, reason=WHY or "")
def test_dp_inner_across_two_nodes_matches_the_local_run_bit_for_bit(tmp_path):
    cl, lo = tmp_path / "emulated.jsonl", tmp_path / "local.jsonl"
    r = subprocess.run(
        [
            sys.executable, "-m", "ratrain", "emulate",
            "--nodes", "2", "--ranks-per-node", "2", "--link-mbit", "200", "--timeout", "100",
            "--", *TRAIN, "--rank-layout", "dp-inner", "--metrics", str(cl),
        ],
        capture_output=True,
        text=True,
        timeout=110,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert main([*TRAIN, "--metrics", str(lo)]) == 0  # the local run, pp-inner
    a = [json.loads(x) for x in cl.read_text().splitlines()]
    b = [json.loads(x) for x in lo.read_text().splitlines()]
    assert [x["step"] for x in a] == [0, 1]
    assert [x["loss"] for x in a] == [x["loss"] for x in b]  # bit for bit
    assert [x["grad_norm"] for x in a] == [x["grad_norm"] for x in b]
