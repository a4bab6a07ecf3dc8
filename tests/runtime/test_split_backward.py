"""The split backward (`ratrain.runtime.split_backward`): B_IN computes the input gradient
and no weight gradient; B_W then gives the weights the gradients an unsplit backward gives,
bit for bit, for every kind of unit."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ratrain.models.presets import get_preset  # noqa: E402
from ratrain.nn.llama import build_unit  # noqa: E402
from ratrain.runtime.split_backward import backward_input, backward_weight  # noqa: E402

SPEC = get_preset("tiny")
QWEN = get_preset("tiny-qwen")  # biases on q, k, v: more weights per intermediate
B, T = 2, 16


def _run(unit, u, x, targets, grad, chunk):
    if u == SPEC.n_layers + 1:
        return unit.loss(x, targets, chunk) * 0.25
    return unit(x)


def _inputs(spec, u, seed):
    g = torch.Generator().manual_seed(seed)
    if u == 0:
        return torch.randint(0, spec.vocab, (B, T), generator=g)
    return torch.randn(B, T, spec.hidden, generator=g)


def _case(spec, u, chunk=None):
    """(unsplit grads, dx) and (split grads, dx, whether B_IN left weight work)."""
    unit = build_unit(spec, u, "torch", seed=3)
    targets = torch.randint(0, spec.vocab, (B, T), generator=torch.Generator().manual_seed(5))
    head = u == spec.n_layers + 1
    grad = (
        None if head else torch.randn(B, T, spec.hidden, generator=torch.Generator().manual_seed(7))
    )
    out = []
    for split in (False, True):
        unit.zero_grad(set_to_none=True)
        x = _inputs(spec, u, 11)
        if u > 0:
            x.requires_grad_()
        y = _run(unit, u, x, targets, grad, chunk)
        params = list(unit.parameters())
        if not split:
            torch.autograd.backward(y, grad)
            out.append(([p.grad.clone() for p in params], x.grad if u > 0 else None, None))
            continue
        called = []
        dx, work = backward_input(y, grad, x, params, lambda called=called: called.append(1))
        before = [p.grad for p in params]
        groups = None if work is None else (len(work.groups), work.whole is not None)
        if work is not None:
            backward_weight(work)
        out.append(([p.grad.clone() for p in params], dx, (work, groups, before, called)))
    return out


@pytest.mark.parametrize("spec", [SPEC, QWEN], ids=lambda s: s.name)
@pytest.mark.parametrize("u", [1, 2])
def test_block_splits_and_matches_unsplit_bitwise(spec, u):
    (g_ref, dx_ref, _), (g, dx, (work, groups, before, called)) = _case(spec, u)
    assert work is not None and groups[0] and not called  # really split
    assert all(b is None for b in before)  # B_IN left every weight gradient to B_W
    assert torch.equal(dx, dx_ref)
    assert len(g) == len(g_ref) > 4
    for a, b in zip(g, g_ref, strict=True):
        assert torch.equal(a, b)


def test_head_with_plain_loss_splits_and_matches():
    (g_ref, dx_ref, _), (g, dx, (work, groups, before, called)) = _case(SPEC, SPEC.n_layers + 1)
    assert work is not None and groups[0] and not called
    assert all(b is None for b in before)
    assert torch.equal(dx, dx_ref)
    assert all(torch.equal(a, b) for a, b in zip(g, g_ref, strict=True))


def test_head_with_fused_chunked_loss_runs_whole_in_b_in():
    """The chunked loss is one custom Function computing both gradients: no split."""
    (g_ref, dx_ref, _), (g, dx, (work, groups, before, called)) = _case(
        SPEC, SPEC.n_layers + 1, chunk=8
    )
    assert work is None and called == [1]
    assert all(b is not None for b in before)  # accumulated in B_IN
    assert torch.equal(dx, dx_ref)
    assert all(torch.equal(a, b) for a, b in zip(g, g_ref, strict=True))


def test_embedding_leaves_everything_to_b_w():
    (g_ref, _, _), (g, dx, (work, groups, before, called)) = _case(SPEC, 0)
    assert dx is None and work is not None and groups == (0, True) and not called
    assert all(b is None for b in before)
    assert all(torch.equal(a, b) for a, b in zip(g, g_ref, strict=True))


def test_b_w_accumulates_onto_existing_gradients_like_autograd():
    """Two microbatches: the second B_W adds to the first's gradients as AccumulateGrad
    does in an unsplit backward (same sums, same order)."""
    unit = build_unit(SPEC, 1, "torch", seed=3)
    params = list(unit.parameters())
    xs = [_inputs(SPEC, 1, s).requires_grad_() for s in (1, 2)]
    gs = [
        torch.randn(B, T, SPEC.hidden, generator=torch.Generator().manual_seed(s)) for s in (3, 4)
    ]
    for x, g in zip(xs, gs, strict=True):
        torch.autograd.backward(unit(x), g)
    ref = [p.grad.clone() for p in params]
    unit.zero_grad(set_to_none=True)
    works = []
    for x, g in zip(xs, gs, strict=True):  # both B_IN first, then both B_W (deferred)
        x.grad = None
        works.append(backward_input(unit(x), g, x, params, lambda: None)[1])
    for w in works:
        backward_weight(w)
    assert all(torch.equal(p.grad, r) for p, r in zip(params, ref, strict=True))


@pytest.mark.parametrize("u", [1, SPEC.n_layers + 1], ids=["block", "head"])
def test_b_w_keeps_exactly_what_the_ledger_counts(u):
    """What the runtime keeps from B_IN to B_W, the saved tensors the weight pass reads
    (distinct storages) and the gradients it restarts from, is the ledger's W-retained
    bytes (`weight_grad_bytes`), to the byte."""
    from ratrain.config import Plan
    from ratrain.runtime.split_backward import SavedActivations
    from ratrain.sizes.activations import weight_grad_bytes

    plan = Plan(micro_batch=B, global_batch=B, seq=T, compute_dtype="fp32")
    unit = build_unit(SPEC, u, "torch", seed=3)
    params = list(unit.parameters())
    x = _inputs(SPEC, u, 11).requires_grad_()
    held = SavedActivations(params)
    with held.hooks():
        if u == SPEC.n_layers + 1:
            y = unit.loss(x, torch.randint(0, SPEC.vocab, (B, T)), None)
            grad = None
        else:
            y, grad = unit(x), torch.randn(B, T, SPEC.hidden)
    _, work = backward_input(y, grad, x, params, lambda: None, held)
    kept = {t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in held.tensors.values()}
    grads = {
        g.untyped_storage()._cdata: g.untyped_storage().nbytes()
        for grp in work.groups
        for gs in grp.grads
        for g in gs or ()
        if g is not None
    }
    assert (sum(kept.values()), sum(grads.values())) == weight_grad_bytes(SPEC, plan, u)
    backward_weight(work)


def test_nothing_outlives_the_weight_pass():
    """B_IN retains the graph for B_W; once B_W has run and the step drops its references,
    the graph and everything held for it are freed (no reference cycle through the saved
    tensors' holder, which would keep every microbatch's activations alive)."""
    import gc
    import weakref

    from ratrain.runtime.split_backward import SavedActivations

    unit = build_unit(SPEC, 1, "torch", seed=3)
    params = list(unit.parameters())
    x = _inputs(SPEC, 1, 11).requires_grad_()
    held = SavedActivations(params)
    with held.hooks():
        y = unit(x)
    out = weakref.ref(y)
    _, work = backward_input(y, torch.randn(B, T, SPEC.hidden), x, params, lambda: None, held)
    backward_weight(work)
    gone = weakref.ref(held)
    del y, work, held
    gc.collect()
    assert gone() is None and out() is None
