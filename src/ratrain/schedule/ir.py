"""The schedule IR: per stage, an ordered list of actions with explicit dependencies.

One IR, three readers: the memory ledger replays it, the simulator times it, the runtime
executes it. Pure Python (no torch).

Layers are named by *unit* (see `ratrain.models.counts`): 0 the embedding, 1..L the
blocks, L+1 the head. Text form, for debugging (after torch.distributed.pipelining's
`2F0`, `1SEND_B3`): ``{stage}{OP}{mb}`` with ``@{unit}`` for layer-level actions and
``@{first}-{last}`` for actions that cover several units, e.g.

    1F3@5        stage 1, forward of unit 5, microbatch 3
    0SEND_F3@4   stage 0 sends unit 4's output activation of microbatch 3
    2SYNC@7      stage 2 starts the gradient sync of unit 7
    0UPD@0-4     stage 0 updates units 0..4 (stage-wide optimizer step)
    1NORM        stage 1 joins the global gradient-norm reduction
    0VF@3#2      stage 0's third fetch of unit 3's view in the step (``#visit`` when > 0)

Dependencies are explicit: `Schedule.deps[a]` lists the actions (on any stage) that must
complete before `a` may start.

Execution semantics (shared by the simulator and the runtime, so predictions mean what
runs): each stage walks its list in order with one issuing thread.
- COMPUTE actions (F, B, RECOMPUTE, UPDATE) block the walk: one runs at a time, and it
  starts when its deps have completed.
- Every other action is *issued* asynchronously when the walk reaches it and runs on its
  resource (P2P, DP_NET, COPY) in issue order (FIFO per resource), starting when the
  resource is free and its deps have completed; the walk goes on at once.
- So a stage waits for an async action only where a later action depends on it: a
  lowering places, e.g., UPDATE(l) at the point in the list where it expects the sync
  of l to have landed.
- Split backward (``pipeline: zb-h1`` or ``zb-h2``, `ratrain.schedule.zerobubble`; Qi et al. 2024,
  "Zero Bubble Pipeline Parallelism"): B(u, mb) is B_IN(u, mb) then B_W(u, mb), each a
  COMPUTE action, or the one B (every 1F1B schedule keeps the unsplit B).
  B_IN (``1BI3@5``) needs the unit's activations (and the received output gradient) and
  produces the input gradient, the critical path to the previous stage; when it ends it
  frees the activations only the input gradient needs and keeps what B_W needs: the
  input of each linear layer and the gradient of each linear layer's output
  (`ratrain.sizes.activations.weight_grad_bytes`). B_W (``1BW3@5``) needs those and
  produces the unit's weight gradient; it frees them. The unit's gradient state starts at
  its first B_W of the step (not at B_IN), so GRAD_SYNC(u) follows the last B_W(u). B_IN
  reads the unit's parameter view (dX = dY·W), B_W does not (dW = dYᵀ·X). A RECOMPUTE
  precedes the B_IN (the first pass that needs the activations). With offload, what B_IN
  keeps for a deferred B_W moves too: OFFLOAD(u, mb)#1 after B_IN, RELOAD(u, mb)#1 before
  B_W (`WEIGHT_VISIT`).
- Transfers are named by the unit whose output (SEND_F / RECV_F) or whose input gradient
  (SEND_B / RECV_B) crosses the boundary, the same unit on both sides; the receiver is the
  stage that owns the next unit (forward) or the previous one (backward). A send pairs
  with the receive of its unit and microbatch (the runtime tags its messages by both), so
  a stage may hold several chunks of the model and exchange with a neighbour both ways
  (``pipeline: zb-v``, `ratrain.schedule.vshape`: stage s holds chunks s and 2pp-1-s).
- Global reductions (NORM, OVF) are one collective over all stages (and DP replicas):
  each stage's instance starts when every stage's instance has been issued and its deps
  have completed.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

__all__ = [
    "Op",
    "Resource",
    "Action",
    "Schedule",
    "WEIGHT_VISIT",
    "boundary_units",
    "format_action",
    "parse_action",
]


class Op(enum.Enum):
    F = "F"  # forward of (unit, mb)
    B = "B"  # backward of (unit, mb)
    B_IN = "BI"  # input-gradient half of B (zero-bubble pipelines; see below)
    B_W = "BW"  # weight-gradient half of B, deferrable
    SEND_F = "SEND_F"  # activation to the next stage
    RECV_F = "RECV_F"  # activation from the previous stage
    SEND_B = "SEND_B"  # activation gradient to the previous stage
    RECV_B = "RECV_B"  # activation gradient from the next stage
    GRAD_SYNC = "SYNC"  # all-reduce (or reduce-scatter when sharded) of units' gradients over DP
    UPDATE = "UPD"  # optimizer step of units
    VIEW_FETCH = "VF"  # materialise the compute-dtype view (cast, or all-gather of shards)
    VIEW_DROP = "VD"  # release the view
    RECOMPUTE = "RC"  # recompute (unit, mb)'s activations from its input checkpoint
    OFFLOAD = "OFF"  # move (unit, mb)'s checkpoint to the host tier
    RELOAD = "REL"  # bring it back
    GRAD_NORM = "NORM"  # global squared-gradient-norm reduction (clipping)
    OVERFLOW = "OVF"  # global fp16 overflow check

    # Members are singletons compared by identity: an identity hash (C speed) instead of
    # Enum's Python-level hash of the name, which every Action hash pays for.
    __hash__ = object.__hash__


class Resource(enum.Enum):
    """What an action occupies while it runs (the simulator's resources per stage)."""

    COMPUTE = "compute"
    COPY = "copy"  # DMA / tier moves
    DP_NET = "dp_net"  # collectives over the data-parallel group
    P2P = "p2p"  # stage-to-stage links
    NONE = "none"  # bookkeeping (VIEW_DROP)


WEIGHT_VISIT = 1
"""The `Action.visit` of an OFFLOAD / RELOAD that moves what B_IN(u, mb) keeps for its
deferred B_W(u, mb) (the linear layers' inputs and output gradients: ``0OFF3@5#1``); visit
0 moves (u, mb)'s activations between its F and its B_IN (or B)."""

_MB_OPS = {
    Op.F,
    Op.B,
    Op.B_IN,
    Op.B_W,
    Op.SEND_F,
    Op.RECV_F,
    Op.SEND_B,
    Op.RECV_B,
    Op.RECOMPUTE,
    Op.OFFLOAD,
    Op.RELOAD,
}
_RESOURCE = {
    Op.F: Resource.COMPUTE,
    Op.B: Resource.COMPUTE,
    Op.B_IN: Resource.COMPUTE,
    Op.B_W: Resource.COMPUTE,
    Op.RECOMPUTE: Resource.COMPUTE,
    Op.UPDATE: Resource.COMPUTE,
    Op.SEND_F: Resource.P2P,
    Op.RECV_F: Resource.P2P,
    Op.SEND_B: Resource.P2P,
    Op.RECV_B: Resource.P2P,
    Op.GRAD_SYNC: Resource.DP_NET,
    Op.GRAD_NORM: Resource.DP_NET,
    Op.OVERFLOW: Resource.DP_NET,
    Op.OFFLOAD: Resource.COPY,
    Op.RELOAD: Resource.COPY,
    Op.VIEW_FETCH: Resource.COPY,  # a cast on the copy engine; an all-gather when sharded (see lowerings)
    Op.VIEW_DROP: Resource.NONE,
}


@dataclass(frozen=True, slots=True, init=False)
class Action:
    op: Op
    stage: int
    units: tuple[int, ...] = ()
    """The units the action touches: one for layer-level actions, several for bucketed or
    stage-wide ones, none for global reductions."""
    mb: int | None = None
    visit: int = 0
    """Tells apart repeats of an otherwise identical action in one stage's step (e.g. a
    transient view fetched and dropped once per use): 0 for the first, 1 for the next..."""

    def __init__(
        self, op: Op, stage: int, units: tuple[int, ...] = (), mb: int | None = None, visit: int = 0
    ) -> None:
        # The dataclass's frozen __init__ sets each field through object.__setattr__; the
        # slots' own descriptors do the same at half the cost (a lowering makes 10^5-10^6
        # actions per plan). Frozen all the same: __setattr__ still raises.
        _SET_OP(self, op)
        _SET_STAGE(self, stage)
        _SET_UNITS(self, units)
        _SET_MB(self, mb)
        _SET_VISIT(self, visit)
        assert (mb is not None) == (op in _MB_OPS), f"{op} mb={mb}"

    @property
    def unit(self) -> int:
        """The single unit of a layer-level action."""
        assert len(self.units) == 1, f"{format_action(self)} covers {self.units}"
        return self.units[0]

    @property
    def resource(self) -> Resource:
        return _RESOURCE[self.op]

    def __str__(self) -> str:
        return format_action(self)

    def __repr__(self) -> str:
        return f"<{format_action(self)}>"


_SET_OP, _SET_STAGE, _SET_UNITS, _SET_MB, _SET_VISIT = (
    Action.__dict__[name].__set__ for name in ("op", "stage", "units", "mb", "visit")
)


def _units_text(units: tuple[int, ...]) -> str:
    if not units:
        return ""
    if len(units) == 1:
        return f"@{units[0]}"
    if units == tuple(range(units[0], units[-1] + 1)):
        return f"@{units[0]}-{units[-1]}"
    return "@" + ",".join(map(str, units))


def boundary_units(units: Iterable[int], head: int) -> tuple[set[int], set[int]]:
    """Of a stage's units, those whose input is received (the unit before is another
    stage's) and those whose output is sent (the unit after is; `head`: the last unit):
    the first and last of a stage, or of each of a V's chunks."""
    mine = set(units)
    return (
        {u for u in mine if u > 0 and u - 1 not in mine},
        {u for u in mine if u < head and u + 1 not in mine},
    )


def format_action(a: Action) -> str:
    mb = "" if a.mb is None else str(a.mb)
    visit = f"#{a.visit}" if a.visit else ""
    return f"{a.stage}{a.op.value}{mb}{_units_text(a.units)}{visit}"


_BY_VALUE = sorted(Op, key=lambda o: -len(o.value))  # longest first: SEND_F before F


def parse_action(text: str) -> Action:
    """Inverse of `format_action`."""
    i = 0
    while i < len(text) and text[i].isdigit():
        i += 1
    if i == 0:
        raise ValueError(f"action {text!r}: no stage number")
    stage, rest = int(text[:i]), text[i:]
    rest, _, visit_text = rest.partition("#")
    for op in _BY_VALUE:
        if rest.startswith(op.value):
            rest = rest[len(op.value) :]
            break
    else:
        raise ValueError(f"action {text!r}: unknown op")
    mb_text, _, units_text = rest.partition("@")
    units: tuple[int, ...] = ()
    if units_text:
        if "-" in units_text:
            lo, hi = units_text.split("-")
            units = tuple(range(int(lo), int(hi) + 1))
        else:
            units = tuple(int(u) for u in units_text.split(","))
    mb = int(mb_text) if mb_text else None
    return Action(op, stage, units, mb, int(visit_text) if visit_text else 0)


@dataclass
class Schedule:
    """Per-stage ordered action lists plus explicit dependencies."""

    stages: list[list[Action]]
    deps: dict[Action, tuple[Action, ...]] = field(default_factory=dict)
    kind: str = ""
    """What built it: a plan's lowering, named as `Plan.schedule` (baseline | gpu-style |
    ratrain | fsdp-pp: `ratrain.schedule.build`); "eval" for the forward-only evaluation
    step (`ratrain.schedule.eval`); a pass order built on its own says what its builder
    was given ("1f1b", `build_1f1b`'s default); "" when unset. The simulator reports it
    as the step's schedule, falling back to `Plan.schedule` (`ratrain.sim.simulate`)."""
    meta: dict = field(default_factory=dict)

    @property
    def pp(self) -> int:
        return len(self.stages)

    def actions(self) -> Iterator[Action]:
        for acts in self.stages:
            yield from acts

    def deps_of(self, a: Action) -> tuple[Action, ...]:
        return self.deps.get(a, ())

    def add_dep(self, a: Action, *before: Action) -> None:
        self.deps[a] = self.deps.get(a, ()) + tuple(before)

    def text(self, stage: int | None = None) -> str:
        """One line per stage: its actions in order, in text form."""
        rows: Iterable[int] = range(self.pp) if stage is None else (stage,)
        return "\n".join(" ".join(format_action(a) for a in self.stages[s]) for s in rows)
