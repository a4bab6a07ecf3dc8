"""Which rank's failure the launcher names (`spawn._raise_failure`): a rank whose
collective lost its peer is a consequence of the peer's crash, and may be stamped first
(the crashing rank's unwinding closes its sockets before its record is written)."""

from __future__ import annotations

import pytest

from ratrain.launch.spawn import RankFailure, _raise_failure

GLOO = (
    "Traceback (most recent call last):\n  ...\nRuntimeError: [/pytorch/third_party/gloo/"
    "gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:40129"
)
CAUSE = (
    "Traceback (most recent call last):\n  ...\nRuntimeError: injected fault on rank 2 at step 2"
)


def test_the_crash_is_named_before_the_peer_that_lost_it():
    results = [None, None, {"error": CAUSE, "t": 10.5}, {"error": GLOO, "t": 10.0}]
    with pytest.raises(RankFailure) as got:
        _raise_failure(results, None)
    assert got.value.rank == 2 and "injected fault" in str(got.value)


def test_a_lost_peer_alone_is_still_named():
    results = [{"ok": 1}, {"error": GLOO, "t": 10.0}]
    with pytest.raises(RankFailure) as got:
        _raise_failure(results, None)
    assert got.value.rank == 1 and "Connection closed by peer" in str(got.value)


def test_otherwise_the_earliest_crash():
    other = CAUSE.replace("rank 2", "rank 0")
    results = [{"error": other, "t": 11.0}, None, {"error": CAUSE, "t": 10.5}]
    with pytest.raises(RankFailure) as got:
        _raise_failure(results, None)
    assert got.value.rank == 2
