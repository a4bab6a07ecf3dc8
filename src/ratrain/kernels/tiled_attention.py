"""Tiled attention, forward and backward (FlashAttention-2, Dao 2023, Algorithms 1 and 2),
executed as a `TilePlan` says.

Forward: each core holds a unit (``heads`` query heads of one kv head x ``q`` rows): its Q
tile and the fp32 running output, row max and row sum; K and V stream through in steps of
``kv`` rows with the online softmax; causal units stop at their last row. It writes O and
the log-sum-exp. Backward: each core holds ``kv`` key rows (K, V, fp32 dK, dV); Q, dO,
LSE and Δ = rowsum(dO ∘ O) stream through; P is recomputed from the LSE; dQ is accumulated
in fp32 by read-modify-write. Only tile x tile score blocks exist, never s x s.

Scores: q·kᵀ / √d, plus slopes[h]·(j − i) with ALiBi, −inf above the diagonal if causal.
The loops are the ones `ratrain.cost.tiling_attention` counts.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ratrain.cost.tiling import TilePlan, chunks, steps
from ratrain.errors import RatrainError
from ratrain.kernels.tiled_engine import Engine, dtype_name

__all__ = ["run_attention_forward", "run_attention_backward"]

_F32 = torch.float32


def _check(plan: TilePlan, op: str, q: torch.Tensor, k: torch.Tensor, causal: bool) -> None:
    b, h, s, d = q.shape
    want = {"batch": b, "heads": h, "kv_heads": k.shape[1], "seq": s, "head_dim": d}
    want["causal"] = int(causal)
    if plan.op != op or plan.shape != want:
        raise RatrainError(
            f"the tile plan is for {plan.op} {plan.shape}, the call is {op} {want}; plan this shape"
        )
    if plan.dtype != dtype_name(q) or k.dtype != q.dtype:
        raise RatrainError(f"the tile plan is for {plan.dtype}, the tensors are {q.dtype}")


def _copy(unit: int, plan: TilePlan) -> int:
    """The core (compute-tier copy) running the unit-th slot of a block: with two units per
    core, slot i shares a core with slot 2p-1-i (a short causal unit with a long one)."""
    p, f = plan.grid
    return unit if f == 1 else min(unit, 2 * p - 1 - unit)


def _bias_(scores, a0: int, j0: int, slopes, causal: bool) -> None:
    """Add ALiBi and the causal mask in place to scores (hg, r, t) of rows a0.. and keys j0.."""
    if slopes is None and not causal:
        return
    r, t = scores.shape[-2:]
    rows = torch.arange(a0, a0 + r)
    dist = torch.arange(j0, j0 + t)[None, :] - rows[:, None]  # (r, t): j - i
    if slopes is not None:
        scores.add_(slopes[:, None, None] * dist)  # (hg, r, t)
    if causal:
        scores.masked_fill_(dist > 0, float("-inf"))


class _FwdCore:
    def __init__(self, eng: Engine, plan: TilePlan, copy: int, d: int, dtype: torch.dtype):
        hg, r, t, leaf = plan.tile["heads"], plan.tile["q"], plan.tile["kv"], plan.leaf
        self.q = [eng.alloc(leaf, (hg, r, d), dtype, copy) for _ in range(2)]
        self.o = eng.alloc(leaf, (hg, r, d), _F32, copy)
        self.m = eng.alloc(leaf, (hg, r), _F32, copy)
        self.l = eng.alloc(leaf, (hg, r), _F32, copy)
        self.s = eng.alloc(leaf, (hg, r, t), _F32, copy)
        self.k = [eng.alloc(leaf, (t, d), dtype, copy) for _ in range(2)]
        self.v = [eng.alloc(leaf, (t, d), dtype, copy) for _ in range(2)]
        self.q_slot = self.kv_slot = 0

    def start(self, rows: int) -> torch.Tensor:
        """Reset the running state for a unit of `rows` rows; returns its Q buffer."""
        self.q_slot ^= 1
        self.r = rows
        self.o[:, :rows].zero_()
        self.m[:, :rows].fill_(float("-inf"))
        self.l[:, :rows].zero_()
        return self.q[self.q_slot][:, :rows]

    def load_kv(self, eng: Engine, ks, vs, j0: int, j1: int, src: str, leaf: str):
        """Rows j0:j1 of K and V (in tier src) into this core's next pair of buffers."""
        self.kv_slot ^= 1
        kt, vt = self.k[self.kv_slot][: j1 - j0], self.v[self.kv_slot][: j1 - j0]
        return eng.move(ks[j0:j1], src, kt, leaf), eng.move(vs[j0:j1], src, vt, leaf)

    def step(self, kt, vt, a0: int, j0: int, slopes, causal: bool, scale: float) -> None:
        """Online-softmax update with one K, V tile (t, d)."""
        r, t = self.r, kt.shape[0]
        o, m, lsum = self.o[:, :r], self.m[:, :r], self.l[:, :r]
        s = self.s[:, :r, :t]
        s.copy_(torch.matmul(self.q[self.q_slot][:, :r].float(), kt.float().t())).mul_(scale)
        _bias_(s, a0, j0, slopes, causal)
        m_new = torch.maximum(m, s.amax(dim=-1))  # (hg, r)
        m_safe = m_new.masked_fill(torch.isinf(m_new), 0.0)  # rows with every key masked so far
        alpha = torch.exp(m - m_safe)
        s.sub_(m_safe[..., None]).exp_()  # P, unnormalised
        lsum.mul_(alpha).add_(s.sum(dim=-1))
        o.mul_(alpha[..., None]).add_(torch.matmul(s, vt.float()))  # (hg, r, t) @ (t, d)
        m.copy_(m_new)

    def finish(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalised O and the log-sum-exp (written over m), in place."""
        r = self.r
        o, m, lsum = self.o[:, :r], self.m[:, :r], self.l[:, :r]
        o.div_(lsum[..., None])
        m.add_(torch.log(lsum))
        return o, m


def run_attention_forward(
    eng: Engine, plan: TilePlan, q, k, v, *, causal: bool, slopes=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """q (B, H, S, D), k, v (B, KV, S, D) in main memory -> O (B, H, S, D), LSE (B, H, S) fp32."""
    _check(plan, "attention", q, k, causal)
    B, H, S, D = q.shape
    KV = k.shape[1]
    g = H // KV
    hg, br, bc = plan.tile["heads"], plan.tile["q"], plan.tile["kv"]
    (p, f), bs, leaf, stage, main = plan.grid, plan.stage_step, plan.leaf, plan.stage, plan.main
    src, scale = stage or main, D**-0.5
    units = [(a0, a1, hs) for a0, a1 in steps(0, S, br) for hs in range(g // hg)]
    with eng.scope():
        out = eng.alloc(main, (B, H, S, D), q.dtype)
        lse = eng.alloc(main, (B, H, S), _F32)
        if stage:
            sk = [eng.alloc(stage, (min(bs, S), D), q.dtype) for _ in range(2)]
            sv = [eng.alloc(stage, (min(bs, S), D), q.dtype) for _ in range(2)]
        cores = [_FwdCore(eng, plan, _copy(i, plan), D, q.dtype) for i in range(p * f)]
        for bi in range(B):
            for kvh in range(KV):
                for blk in chunks(units, p * f):
                    heads = [slice(kvh * g + hs * hg, kvh * g + (hs + 1) * hg) for _, _, hs in blk]
                    for core, (a0, a1, _), hh in zip(cores, blk, heads, strict=False):
                        eng.move(q[bi, hh, a0:a1], main, core.start(a1 - a0), leaf)
                    end = max(a1 for _, a1, _ in blk) if causal else S
                    for st, (k0, k1) in enumerate(steps(0, end, bs)):
                        if stage:  # K, V rows once for the whole block
                            ks = eng.move(k[bi, kvh, k0:k1], main, sk[st % 2][: k1 - k0], stage)
                            vs = eng.move(v[bi, kvh, k0:k1], main, sv[st % 2][: k1 - k0], stage)
                            base = k0
                        else:
                            ks, vs, base = k[bi, kvh], v[bi, kvh], 0
                        for core, (a0, a1, _), hh in zip(cores, blk, heads, strict=False):
                            sl = None if slopes is None else slopes[hh]
                            for j0, j1 in steps(k0, min(k1, a1) if causal else k1, bc):
                                kt, vt = core.load_kv(eng, ks, vs, j0 - base, j1 - base, src, leaf)
                                core.step(kt, vt, a0, j0, sl, causal, scale)
                                eng.add_flops(4 * hg * (a1 - a0) * (j1 - j0) * D)
                    for core, (a0, a1, _), hh in zip(cores, blk, heads, strict=False):
                        o, row_lse = core.finish()
                        eng.move(o, leaf, out[bi, hh, a0:a1], main)
                        eng.move(row_lse, leaf, lse[bi, hh, a0:a1], main)
    return out, lse


def _delta(eng: Engine, plan: TilePlan, out, dout, delta) -> None:
    """Δ = rowsum(dO ∘ O) (B, H, S), in tiles of heads x q rows through the compute tier."""
    B, H, S, D = out.shape
    KV = plan.shape["kv_heads"]
    g, hg, br, leaf, main = H // KV, plan.tile["heads"], plan.tile["q"], plan.leaf, plan.main
    with eng.scope():
        bo = [eng.alloc(leaf, (hg, br, D), out.dtype) for _ in range(2)]
        bd = [eng.alloc(leaf, (hg, br, D), out.dtype) for _ in range(2)]
        bl = [eng.alloc(leaf, (hg, br), _F32) for _ in range(2)]
        slot = 0
        for bi in range(B):
            for kvh in range(KV):
                for a0, a1 in steps(0, S, br):
                    for hs in range(g // hg):
                        hh, r, slot = (
                            slice(kvh * g + hs * hg, kvh * g + (hs + 1) * hg),
                            a1 - a0,
                            slot ^ 1,
                        )
                        ot = eng.move(out[bi, hh, a0:a1], main, bo[slot][:, :r], leaf)
                        dt = eng.move(dout[bi, hh, a0:a1], main, bd[slot][:, :r], leaf)
                        bl[slot][:, :r].copy_((ot.float() * dt.float()).sum(dim=-1))
                        eng.move(bl[slot][:, :r], leaf, delta[bi, hh, a0:a1], main)


class _BwdCore:
    def __init__(self, eng: Engine, plan: TilePlan, copy: int, d: int, dtype: torch.dtype):
        hg, r, t, leaf = plan.tile["heads"], plan.tile["q"], plan.tile["kv"], plan.leaf

        def two(shape, dt):
            return [eng.alloc(leaf, shape, dt, copy) for _ in range(2)]

        self.k, self.v = two((t, d), dtype), two((t, d), dtype)
        self.dk = eng.alloc(leaf, (t, d), _F32, copy)
        self.dv = eng.alloc(leaf, (t, d), _F32, copy)
        self.q, self.do = two((hg, r, d), dtype), two((hg, r, d), dtype)
        self.lse, self.delta = two((hg, r), _F32), two((hg, r), _F32)
        self.dq = two((hg, r, d), _F32)
        self.p = eng.alloc(leaf, (hg, r, t), _F32, copy)
        self.ds = eng.alloc(leaf, (hg, r, t), _F32, copy)
        self.kv_slot = self.slot = 0

    def start(self, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.kv_slot ^= 1
        self.t = t
        self.dk[:t].zero_()
        self.dv[:t].zero_()
        return self.k[self.kv_slot][:t], self.v[self.kv_slot][:t]

    def step(self, r: int, a0: int, c0: int, slopes, causal: bool, scale: float) -> None:
        """One q step of r rows (buffers in `self.slot`) against this core's keys c0.."""
        t, i = self.t, self.slot
        qf, dof = self.q[i][:, :r].float(), self.do[i][:, :r].float()  # (hg, r, d)
        kf, vf = self.k[self.kv_slot][:t].float(), self.v[self.kv_slot][:t].float()  # (t, d)
        d = kf.shape[1]
        p, ds = self.p[:, :r, :t], self.ds[:, :r, :t]
        p.copy_(torch.matmul(qf, kf.t())).mul_(scale)
        _bias_(p, a0, c0, slopes, causal)
        p.sub_(self.lse[i][:, :r, None]).exp_()  # P recomputed from the LSE; masked -> 0
        self.dv[:t].add_(p.reshape(-1, t).t() @ dof.reshape(-1, d))  # (t, hg·r) @ (hg·r, d)
        ds.copy_(torch.matmul(dof, vf.t()))  # dP (hg, r, t)
        ds.sub_(self.delta[i][:, :r, None]).mul_(p)  # dS = P ∘ (dP − Δ)
        self.dq[i][:, :r].add_(torch.matmul(ds, kf), alpha=scale)
        self.dk[:t].add_(ds.reshape(-1, t).t() @ qf.reshape(-1, d), alpha=scale)


class _Panel(NamedTuple):
    """Q, dO, LSE, Δ and the dQ partial sums of hg heads x some rows, from row `base` on:
    a staged panel, or (unstaged) views of main memory."""

    q: torch.Tensor
    do: torch.Tensor
    lse: torch.Tensor
    delta: torch.Tensor
    dq: torch.Tensor
    base: int


class _Staging:
    """The staging tier's double-buffered panels (backward)."""

    def __init__(self, eng: Engine, plan: TilePlan, d: int, dtype: torch.dtype):
        hg, rows, tier = plan.tile["heads"], min(plan.stage_step, plan.shape["seq"]), plan.stage

        def two(shape, dt):
            return [eng.alloc(tier, shape, dt) for _ in range(2)]

        self.q, self.do = two((hg, rows, d), dtype), two((hg, rows, d), dtype)
        self.lse, self.delta = two((hg, rows), _F32), two((hg, rows), _F32)
        self.dq = two((hg, rows, d), _F32)
        self.slot = 0

    def load(self, eng: Engine, main: str, tier: str, src: _Panel, rows: slice, fresh: bool):
        """Bring rows of src (main memory) in; dQ starts at zero on its first visit."""
        self.slot ^= 1
        i, r = self.slot, rows.stop - rows.start
        got = [
            eng.move(x[:, rows], main, buf[i][:, :r], tier)
            for x, buf in (
                (src.q, self.q),
                (src.do, self.do),
                (src.lse, self.lse),
                (src.delta, self.delta),
            )
        ]
        dq = self.dq[i][:, :r]
        if fresh:
            dq.zero_()
        else:
            eng.move(src.dq[:, rows], main, dq, tier)
        return _Panel(*got, dq, rows.start)


def _visit(
    eng, plan, core: _BwdCore, panel: _Panel, rows, keys, fresh: bool, final, slopes, causal
):
    """One core, one q step: load it, update dK, dV and dQ, store the dQ partial sums (or,
    unstaged and on the last visit, the final dQ) back where they came from."""
    (a0, a1), (c0, c1) = rows, keys
    src, leaf = plan.stage or plan.main, plan.leaf
    r, x = a1 - a0, slice(a0 - panel.base, a1 - panel.base)
    core.slot ^= 1
    i = core.slot
    eng.move(panel.q[:, x], src, core.q[i][:, :r], leaf)
    eng.move(panel.do[:, x], src, core.do[i][:, :r], leaf)
    eng.move(panel.lse[:, x], src, core.lse[i][:, :r], leaf)
    eng.move(panel.delta[:, x], src, core.delta[i][:, :r], leaf)
    dqt = core.dq[i][:, :r]
    if fresh:
        dqt.zero_()
    else:
        eng.move(panel.dq[:, x], src, dqt, leaf)
    d = panel.q.shape[-1]
    core.step(r, a0, c0, slopes, causal, d**-0.5)
    eng.add_flops(10 * plan.tile["heads"] * r * (c1 - c0) * d)
    eng.move(dqt, leaf, panel.dq[:, x] if plan.stage else final[:, a0:a1], src)


def run_attention_backward(
    eng: Engine, plan: TilePlan, q, k, v, out, lse, dout, *, causal: bool, slopes=None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dq, dk, dv) of the attention from its inputs, O, the LSE and dO."""
    _check(plan, "attention_backward", q, k, causal)
    B, H, S, D = q.shape
    KV = k.shape[1]
    g, hg, br, bc = H // KV, plan.tile["heads"], plan.tile["q"], plan.tile["kv"]
    (p, f), bs, leaf, stage, main = plan.grid, plan.stage_step, plan.leaf, plan.stage, plan.main
    blocks = chunks(steps(0, S, bc), p * f)
    with eng.scope():
        dq = eng.alloc(main, (B, H, S, D), q.dtype)
        dk, dv = (eng.alloc(main, (B, KV, S, D), q.dtype) for _ in range(2))
        dq_acc = eng.alloc(main, (B, H, S, D), _F32)  # fp32 partial sums between visits
        delta = eng.alloc(main, (B, H, S), _F32)
        _delta(eng, plan, out, dout, delta)
        staging = _Staging(eng, plan, D, q.dtype) if stage else None
        cores = [_BwdCore(eng, plan, _copy(i, plan), D, q.dtype) for i in range(p * f)]
        for bi, kvh in ((bi, kvh) for bi in range(B) for kvh in range(KV)):
            for j, blk in enumerate(blocks):
                for core, (c0, c1) in zip(cores, blk, strict=False):
                    kt, vt = core.start(c1 - c0)
                    eng.move(k[bi, kvh, c0:c1], main, kt, leaf)
                    eng.move(v[bi, kvh, c0:c1], main, vt, leaf)
                for a0p, a1p in steps(0, S, bs):
                    if causal and a1p - 1 < blk[0][0]:
                        continue  # no key of the block is visible to these rows
                    # The last block to see these rows writes the final dQ.
                    last = (
                        min(len(blocks) - 1, (a1p - 1) // (p * f * bc))
                        if causal
                        else len(blocks) - 1
                    )
                    for hs in range(g // hg):
                        hh = slice(kvh * g + hs * hg, kvh * g + (hs + 1) * hg)
                        final = (dq if j == last else dq_acc)[bi, hh]
                        mem = _Panel(
                            q[bi, hh], dout[bi, hh], lse[bi, hh], delta[bi, hh], dq_acc[bi, hh], 0
                        )
                        panel = (
                            staging.load(eng, main, stage, mem, slice(a0p, a1p), j == 0)
                            if stage
                            else mem
                        )
                        for i, (core, keys) in enumerate(zip(cores, blk, strict=False)):
                            for rows in steps(a0p, a1p, br):
                                if not causal or rows[1] - 1 >= keys[0]:
                                    # Keys from 0 (block 0, core 0) make every row's first visit.
                                    fresh = j == 0 and i == 0
                                    sl = None if slopes is None else slopes[hh]
                                    _visit(
                                        eng, plan, core, panel, rows, keys, fresh, final, sl, causal
                                    )
                        if stage:
                            eng.move(panel.dq, stage, final[:, a0p:a1p], main)
                for core, (c0, c1) in zip(cores, blk, strict=False):
                    eng.move(core.dk[: c1 - c0], leaf, dk[bi, kvh, c0:c1], main)
                    eng.move(core.dv[: c1 - c0], leaf, dv[bi, kvh, c0:c1], main)
    return dq, dk, dv
