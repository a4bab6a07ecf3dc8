"""A unit's backward in two passes: the input gradient now, the weight gradients later.

Zero-bubble schedules (`ratrain.schedule.zerobubble`) split B(u, mb) into B_IN(u, mb),
which the previous stage waits for, and B_W(u, mb), which nothing downstream waits for.
Both passes run autograd's own nodes on the graph the unit's forward recorded, so every
gradient is computed by the same kernels on the same operands as in an unsplit backward:

- `backward_input` finds, in the graph from the unit's output y back to its input x, the
  nodes where the weights' branches leave the input's path (the *intermediates*: e.g. a
  linear's matmul node, which computes both the input's and the weight's gradient). It
  hooks them, runs ``autograd.grad(y, x, retain_graph=True)``, which computes the input's
  branch only, and keeps what arrived at each intermediate: the gradients of its outputs.
- `backward_weight` restarts autograd at those intermediates with the kept gradients,
  towards the weights only (``autograd.backward(edges, grads, inputs=weights)``): each
  weight's gradient is accumulated by its own AccumulateGrad node, hooks and all, exactly
  as an unsplit backward would.

The idea is the one of Qi et al. 2024 ("Zero Bubble Pipeline Parallelism", §2) and of
torch.distributed.pipelining's `stage_backward_input` / `stage_backward_weight`.

Where the split cannot be made on autograd's nodes, the unit is *unsplit*: B_IN runs its
whole backward and B_W has nothing left to do. That is the case when a weight's branch
leaves the input's path at a custom `autograd.Function` (whose backward computes all its
inputs' gradients at once: the fused chunked loss, the tiled and half-precision CPU
kernels, compiled units), and for a unit whose input needs no gradient (the embedding,
whose backward is all weight gradient: B_IN does nothing and B_W runs it whole).

What B_W keeps alive between the two passes: the kept gradients (the outputs' gradients
of the intermediates, e.g. dY of each linear) and, when the forward ran under
`SavedActivations`, only the saved tensors of the nodes B_W runs (e.g. the input X of each
linear: dW = dYᵀ·X); the other tensors the forward saved are released when B_IN returns,
as `ratrain.sizes.activations.weight_grad_bytes` counts. Without it, the graph below the
intermediates keeps everything autograd saved for it until B_W.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.autograd.graph import GradientEdge, Node, get_gradient_edge

from ratrain.runtime.lifecycle import move_tensors

__all__ = ["SavedActivations", "WeightWork", "backward_input", "backward_weight"]


@dataclass
class _Group:
    """Weights whose branches leave the input's path at the same intermediates."""

    params: list[torch.Tensor]
    nodes: list[Node]
    grads: list[tuple | None] = field(default_factory=list)


@dataclass
class WeightWork:
    """What B_IN(u, mb) leaves for B_W(u, mb)."""

    groups: list[_Group] = field(default_factory=list)
    whole: tuple[torch.Tensor, torch.Tensor | None] | None = None
    """(output, its gradient): the whole backward, when B_IN could not run any of it."""
    small: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    """(weight, gradient) of the one-dimensional weights (norms, biases): computed by B_IN
    (reductions over tokens of what it holds), accumulated by B_W."""
    saved: SavedActivations | None = None
    """Where the forward's tensors the weight pass reads are held (None: in the graph)."""
    ready: torch.cuda.Event | None = None

    def move(self, device: torch.device, stream: torch.cuda.Stream | None) -> None:
        """OFFLOAD / RELOAD #1: what B_W reads (the forward's tensors the holder kept, the
        kept output gradients, the small weights' gradients) copied to `device` on the copy
        stream (`ratrain.runtime.lifecycle.move_tensors`; on a CPU device nothing moves)."""
        if self.saved is not None:
            self.saved.move(device, stream)
        flat = [t for g in self.groups for kept in g.grads for t in kept or () if t is not None]
        flat += [gr for _, gr in self.small]
        moved = move_tensors(flat, device, stream)
        if moved is None:
            return
        it = iter(moved[0])
        for g in self.groups:
            g.grads = [
                None if kept is None else tuple(None if t is None else next(it) for t in kept)
                for kept in g.grads
            ]
        self.small = [(p, next(it)) for p, _ in self.small]
        self.ready = moved[1]


def _parents(root: Node) -> dict[Node, list[Node]]:
    """Every node of the graph under `root` -> the nodes that feed gradient into it."""
    parents: dict[Node, list[Node]] = collections.defaultdict(list)
    seen, todo = {root}, [root]
    while todo:
        node = todo.pop()
        for nxt, _ in node.next_functions:
            if nxt is None:
                continue
            parents[nxt].append(node)
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return parents


def _upward(starts: list[Node], parents: dict, stop: set[Node]) -> tuple[set[Node], set[Node]]:
    """Nodes reached from `starts` towards the output, not entering `stop`; and the nodes of
    `stop` met on the way."""
    seen, met, todo = set(starts), set(), list(starts)
    while todo:
        for p in parents.get(todo.pop(), ()):
            if p in stop:
                met.add(p)
            elif p not in seen:
                seen.add(p)
                todo.append(p)
    return seen, met


class SavedActivations:
    """The tensors autograd saves for one (unit, mb) in its forward
    (`torch.autograd.graph.saved_tensors_hooks`), held here instead of in the graph, so that
    `backward_input` can release the ones `backward_weight` will not read. Parameters (and
    views of them) are left to autograd: they are not activations."""

    def __init__(self, params):
        self.skip = {id(p) for p in params}
        self.tensors: dict[int, torch.Tensor] = {}
        self.reading: set[int] | None = None
        self.ready: torch.cuda.Event | None = None

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, t: torch.Tensor):
        base = t._base
        if id(t) in self.skip or isinstance(t, torch.nn.Parameter) or id(base) in self.skip:
            return (False, t)
        key = len(self.tensors)
        # detached: a saved output keeps no grad_fn here, else node -> hook -> this holder
        # -> tensor -> node would be a cycle that outlives the step (B_IN retains the graph)
        self.tensors[key] = t.detach()
        return (True, key)

    def _unpack(self, handle):
        kept, v = handle
        if not kept:
            return v
        if self.reading is not None:
            self.reading.add(v)
        if self.ready is not None:
            torch.cuda.current_stream().wait_event(self.ready)
        return self.tensors[v]

    def move(self, device: torch.device, stream: torch.cuda.Stream | None) -> None:
        """OFFLOAD / RELOAD of what the forward saved (before B_IN, so all of it): copied
        to `device` on the copy stream (`ratrain.runtime.lifecycle.move_tensors`)."""
        keys = list(self.tensors)
        moved = move_tensors([self.tensors[k] for k in keys], device, stream)
        if moved is not None:
            self.tensors = dict(zip(keys, moved[0], strict=True))
            self.ready = moved[1]

    def keep_for(self, nodes: set[Node]) -> None:
        """Release every tensor but those the saved variables of `nodes` refer to."""
        self.reading = set()
        try:
            for node in nodes:
                for name in _saved_names(type(node)):
                    getattr(node, name)  # unpacks: records the keys it reads
            self.tensors = {k: t for k, t in self.tensors.items() if k in self.reading}
        finally:
            self.reading = None


_SAVED_NAMES: dict[type, tuple[str, ...]] = {}


def _saved_names(cls: type) -> tuple[str, ...]:
    names = _SAVED_NAMES.get(cls)
    if names is None:
        names = _SAVED_NAMES[cls] = tuple(
            n for n in dir(cls) if n.startswith("_saved_") and not n.endswith("sym_sizes")
        )
    return names


def _groups(
    y: torch.Tensor, x: torch.Tensor, params: list[torch.Tensor], w_nodes: set[Node]
) -> list[_Group] | None:
    """The weight groups of the graph y <- x, or None when the unit cannot be split;
    `w_nodes` gets every node the weight pass will run."""
    parents = _parents(y.grad_fn)
    on_path, _ = _upward([get_gradient_edge(x).node], parents, set())
    by_node: dict[Node, _Group] = {}
    for p in params:
        if not p.requires_grad or p.dim() == 1:  # one-dimensional: B_IN computes them
            continue
        acc = get_gradient_edge(p).node
        if acc not in parents:  # not used by this unit's forward
            continue
        side, met = _upward([acc], parents, on_path)
        if any(isinstance(n, torch.autograd.function.BackwardCFunction) for n in met):
            return None
        w_nodes |= side | met
        joined = {id(by_node[n]): by_node[n] for n in met if n in by_node}
        group = _Group([p], sorted(met, key=lambda n: n._sequence_nr()))
        for g in joined.values():  # weights sharing an intermediate form one group
            group.params += g.params
            group.nodes += [n for n in g.nodes if n not in group.nodes]
        for n in group.nodes:
            by_node[n] = group
    unique = {id(g): g for g in by_node.values()}
    return list(unique.values())


def backward_input(
    y: torch.Tensor,
    grad: torch.Tensor | None,
    x: torch.Tensor,
    params: list[torch.Tensor],
    before_whole: Callable[[], None],
    saved: SavedActivations | None = None,
) -> tuple[torch.Tensor | None, WeightWork | None]:
    """B_IN: the gradient of x, and the work left for `backward_weight` (None: the whole
    backward ran here, `before_whole` first, the weights' gradients accumulated). `x` is a
    leaf; `params` are the unit's weights (their gradients are untouched when the split is
    made). `saved`: where the forward's saved tensors are held; those the weight pass will
    not read are released here."""
    if not x.requires_grad:  # the embedding: all of its backward is weight gradient
        return None, WeightWork(whole=(y, grad))
    w_nodes: set[Node] = set()
    groups = _groups(y, x, params, w_nodes)
    if groups is None:
        before_whole()
        torch.autograd.backward(y, grad)
        return x.grad, None
    handles = []
    for g in groups:
        g.grads = [None] * len(g.nodes)
        for i, node in enumerate(g.nodes):

            def keep(grad_outputs, g=g, i=i):
                g.grads[i] = grad_outputs

            handles.append(node.register_prehook(keep))
    small = [p for p in params if p.requires_grad and p.dim() == 1]
    try:
        dx, *gs = torch.autograd.grad(y, [x, *small], grad, retain_graph=True, allow_unused=True)
    finally:
        for h in handles:
            h.remove()
    if saved is not None:
        saved.keep_for(w_nodes)
    kept = [(p, g) for p, g in zip(small, gs, strict=True) if g is not None]
    return dx, WeightWork(groups, small=kept, saved=saved)


def backward_weight(work: WeightWork) -> None:
    """B_W: accumulate the weights' gradients from what `backward_input` kept, releasing
    the graph."""
    if work.ready is not None:  # reloaded on the copy stream
        torch.cuda.current_stream().wait_event(work.ready)
    if work.whole is not None:
        torch.autograd.backward(*work.whole)
        work.whole = None
        return
    if work.small:  # through each weight's own AccumulateGrad node, hooks and all
        weights, grads = zip(*work.small, strict=True)
        torch.autograd.backward([get_gradient_edge(p) for p in weights], list(grads))
    work.small = []
    for g in work.groups:
        edges, grads = [], []
        for node, kept in zip(g.nodes, g.grads, strict=True):
            for i, gr in enumerate(kept or ()):
                if gr is not None:
                    edges.append(GradientEdge(node, i))
                    grads.append(gr)
        if not edges:
            continue
        handles = []
        if len(g.nodes) > 1:  # an intermediate under another gets its kept gradient only
            for node, kept in zip(g.nodes, g.grads, strict=True):
                handles.append(node.register_prehook(lambda _, kept=kept: kept))
        try:
            torch.autograd.backward(edges, grads, inputs=g.params)
        finally:
            for h in handles:
                h.remove()
    work.groups = []
