"""One rank of a peer system, as torchrun starts it on each node (of an emulated network
`ratrain bench cluster` runs on, or of real machines):

    python -m ratrain.bench.peer_rank CONFIG.json OUT_DIR

CONFIG.json (`config_for` writes it):

    {"system": a `ratrain.bench.peers.TORCH_PIPELINES` key or "deepspeed",
     "model": dataclasses.asdict(ModelSpec), "plan": Plan.to_dict(),
     "cfg": TrainConfig's fields (at least steps, seed, lr),
     "data": "synthetic" (or a path `ratrain.data.make_source` reads),
     "layout": "pp-inner" | "dp-inner", "measure": bool,
     the torch peers' knobs: "dp_wrap" (`peers.DP_WRAPS`), "activation_checkpoint": bool,
     deepspeed's: "zero_stage" (0 | 1), "ac_interval": int >= 0}

A knob of the other family must keep its default (a DDP wrap asked of DeepSpeed would
silently do nothing); deepspeed places its ranks data-parallel innermost, so its layout is
dp-inner. The rendezvous comes from the environment (torchrun's RANK, WORLD_SIZE, ...,
`ratrain.launch.grid.rendezvous_from_env`), and the world must be the plan's pp x dp.

Each rank writes OUT_DIR/rank-{rank}.json: what the peer's rank function returns (step
periods, peak RSS, the peak tensor bytes with "measure", every step's loss on the ranks
that hold the last chunk; see `ratrain.bench.peers`). A mistake in the config is one line on stderr and exit
2; any other failure exits non-zero.

`run_local(config)` runs the same config on ranks spawned on this machine
(`ratrain.launch.spawn`) and returns every rank's dict, rank order.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import sys
from pathlib import Path

from ratrain.bench.peers import (
    DP_WRAPS,
    DS_ZERO_STAGES,
    TORCH_PIPELINES,
    check_dp_wrap,
    chunk_split,
)
from ratrain.config import Plan, TrainConfig
from ratrain.errors import RatrainError
from ratrain.models.spec import ModelSpec
from ratrain.ranks import RANK_LAYOUTS

__all__ = ["SYSTEMS", "KNOBS", "config_for", "check_config", "rank_main", "run_local", "main"]

SYSTEMS = (*TORCH_PIPELINES, "deepspeed")
"""The peer systems a config may name (`peers.TORCH_PIPELINES` and deepspeed)."""

DEFAULT_LAYOUT = "dp-inner"
"""The peers' own placement: torchtitan's mesh puts pp outermost, DeepSpeed's topology
has data innermost."""

KNOBS = {
    "dp_wrap": "allreduce",
    "activation_checkpoint": False,
    "zero_stage": 0,
    "ac_interval": 0,
    "layout": DEFAULT_LAYOUT,
    "measure": False,
}
"""Every knob and its default."""

_TORCH_KNOBS = ("dp_wrap", "activation_checkpoint")
_DS_KNOBS = ("zero_stage", "ac_interval")


def config_for(
    system: str,
    spec: ModelSpec,
    plan: Plan,
    cfg: TrainConfig,
    *,
    data: str = "synthetic",
    **knobs,
) -> dict:
    """The config of one peer run (JSON-safe; `KNOBS` not given take their defaults).
    Checked as the ranks will check it (`check_config`)."""
    unknown = sorted(set(knobs) - set(KNOBS))
    if unknown:
        raise RatrainError(f"peer config: unknown knob(s) {unknown}; known: {sorted(KNOBS)}")
    config = {
        "system": system,
        "model": dataclasses.asdict(spec),
        "plan": plan.to_dict(),
        "cfg": dataclasses.asdict(cfg),
        "data": str(data),
        **KNOBS,
        **knobs,
    }
    check_config(config)
    return config


@dataclasses.dataclass(frozen=True)
class _Run:
    """A checked config."""

    system: str
    spec: ModelSpec
    plan: Plan
    cfg: TrainConfig
    data: str
    knobs: dict


def _bool(config: dict, key: str) -> bool:
    v = config[key]
    if not isinstance(v, bool):
        raise RatrainError(f"peer config: {key} must be true or false, got {v!r}")
    return v


def _int(config: dict, key: str, low: int) -> int:
    v = config[key]
    if not isinstance(v, int) or isinstance(v, bool) or v < low:
        raise RatrainError(f"peer config: {key} must be an integer >= {low}, got {v!r}")
    return v


def _section(config: dict, key: str) -> dict:
    v = config.get(key)
    if not isinstance(v, dict):
        raise RatrainError(f"peer config: {key} must be an object, got {v!r}")
    return v


def _parsed(what: str, fn, *args):
    """fn(*args), any mistake it finds in the config as one RatrainError line."""
    try:
        return fn(*args)
    except RatrainError:
        raise
    except (TypeError, ValueError) as e:
        line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RatrainError(f"peer config: {what}: {line}") from None


def check_config(config) -> _Run:
    """The run a config asks for; RatrainError (one line) on any mistake in it."""
    if not isinstance(config, dict):
        raise RatrainError(f"peer config must be a JSON object, got {type(config).__name__}")
    known = {"system", "model", "plan", "cfg", "data", *KNOBS}
    unknown = sorted(set(config) - known)
    if unknown:
        raise RatrainError(f"peer config: unknown key(s) {unknown}; known: {sorted(known)}")
    missing = [k for k in ("system", "model", "plan", "cfg") if k not in config]
    if missing:
        raise RatrainError(f"peer config: missing key(s) {missing}")
    config = {"data": "synthetic", **KNOBS, **config}
    system = config["system"]
    if system not in SYSTEMS:
        raise RatrainError(
            f"peer config: system must be one of {', '.join(SYSTEMS)}, got {system!r}"
        )
    spec = _parsed("model", ModelSpec.from_dict, _section(config, "model"))
    plan = _parsed("plan", Plan.from_dict, _section(config, "plan"))
    _parsed("plan", plan.check_for, spec)
    cfg_d = _section(config, "cfg")
    train_fields = {f.name for f in dataclasses.fields(TrainConfig)}
    bad = sorted(set(cfg_d) - train_fields)
    if bad:
        raise RatrainError(f"peer config: cfg has unknown field(s) {bad}")
    cfg = _parsed("cfg", lambda d: TrainConfig(**d), cfg_d)
    if not isinstance(config["data"], str) or not config["data"]:
        raise RatrainError(
            f"peer config: data must be 'synthetic' or a path, got {config['data']!r}"
        )
    if config["dp_wrap"] not in DP_WRAPS:
        raise RatrainError(
            f"peer config: dp_wrap must be one of {', '.join(DP_WRAPS)}, got {config['dp_wrap']!r}"
        )
    if system != "deepspeed":
        try:
            check_dp_wrap(system, config["dp_wrap"])
        except RatrainError as e:
            raise RatrainError(f"peer config: {e}") from None
    if config["zero_stage"] not in DS_ZERO_STAGES or isinstance(config["zero_stage"], bool):
        raise RatrainError(
            f"peer config: zero_stage must be one of {', '.join(map(str, DS_ZERO_STAGES))} "
            f"(DeepSpeed's pipeline engine runs no other), got {config['zero_stage']!r}"
        )
    if config["layout"] not in RANK_LAYOUTS:
        raise RatrainError(
            f"peer config: layout must be one of {', '.join(RANK_LAYOUTS)}, "
            f"got {config['layout']!r}"
        )
    knobs = {
        "dp_wrap": config["dp_wrap"],
        "activation_checkpoint": _bool(config, "activation_checkpoint"),
        "zero_stage": config["zero_stage"],
        "ac_interval": _int(config, "ac_interval", 0),
        "layout": config["layout"],
        "measure": _bool(config, "measure"),
    }
    other = _TORCH_KNOBS if system == "deepspeed" else _DS_KNOBS
    for k in other:
        if knobs[k] != KNOBS[k]:
            raise RatrainError(
                f"peer config: {k} does not apply to {system}; leave it at {KNOBS[k]!r}"
            )
    if system == "deepspeed" and knobs["layout"] != "dp-inner":
        raise RatrainError(
            "peer config: deepspeed places its data-parallel ranks innermost; its layout is "
            f"dp-inner, not {knobs['layout']!r}"
        )
    if system != "deepspeed":
        style = TORCH_PIPELINES[system][1]
        if style is not None:
            try:
                chunk_split(spec, plan, style)
            except ValueError as e:
                raise RatrainError(f"peer config: {system}: {e}") from None
    return _Run(system, spec, plan, cfg, config["data"], knobs)


def _source(run: _Run):
    from ratrain.data import make_source

    return functools.partial(make_source, run.data, run.spec, run.plan.seq, run.cfg.seed)


def rank_main(rdzv, config: dict) -> dict:
    """This rank's run of `config` (a rank function for `ratrain.launch.spawn.spawn`): the
    peer's rank function's dict, JSON-safe."""
    from ratrain.bench import peers

    run = check_config(config)
    world = run.plan.pp * run.plan.dp
    if rdzv.world_size != world:
        raise RatrainError(
            f"peer run: {rdzv.world_size} ranks were started for pp x dp = {run.plan.pp} x "
            f"{run.plan.dp} = {world}; start {world}"
        )
    k = run.knobs
    args = (rdzv, run.spec, run.plan, run.cfg, _source(run))
    if run.system == "deepspeed":
        if not peers.deepspeed_available():
            raise RatrainError("peer run: deepspeed is not importable (pip install deepspeed)")
        out = peers.deepspeed_rank(
            *args,
            zero_stage=k["zero_stage"],
            ac_interval=k["ac_interval"],
            measure=k["measure"],
        )
    else:
        out = peers.torch_pipelining_rank(
            *args,
            measure=k["measure"],
            system=run.system,
            dp_wrap=k["dp_wrap"],
            activation_checkpoint=k["activation_checkpoint"],
            layout=k["layout"],
        )
    return _json_safe(out | {"system": run.system, "world_size": rdzv.world_size})


def _json_safe(v):
    """Tuples as lists, non-finite floats as None (strict JSON has neither)."""
    if isinstance(v, dict):
        return {str(k): _json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def run_local(config: dict, deadline_s: float = 600.0) -> list[dict]:
    """Run `config` on pp x dp ranks spawned on this machine; every rank's dict, rank
    order. A mistake in the config raises RatrainError before any rank starts."""
    from ratrain.launch.spawn import spawn

    run = check_config(config)
    return spawn(rank_main, run.plan.pp * run.plan.dp, config, deadline_s=deadline_s)


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1, allow_nan=False))
    tmp.replace(path)


def _read_config(path: str) -> dict:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise RatrainError(f"cannot read peer config {path!r}: {e.strerror or e}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise RatrainError(f"peer config {path!r} is not JSON: {e}") from None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    prog = "python -m ratrain.bench.peer_rank"
    if len(argv) != 2:
        print(f"usage: {prog} CONFIG.json OUT_DIR", file=sys.stderr)
        return 2
    try:
        from ratrain.launch.grid import rendezvous_from_env

        config = _read_config(argv[0])
        check_config(config)
        rdzv = rendezvous_from_env()
        if rdzv is None:
            raise RatrainError(
                "no rendezvous in the environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); "
                "start it with torchrun ... -m ratrain.bench.peer_rank, or use run_local"
            )
        out_dir = Path(argv[1])
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RatrainError(f"cannot create {str(out_dir)!r}: {e.strerror or e}") from None
        result = rank_main(rdzv, config)
        _write_json(out_dir / f"rank-{rdzv.rank}.json", result)
    except RatrainError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
