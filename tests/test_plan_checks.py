"""A Plan's layer split and recompute are checked when it is built: what is wrong is said
in one line (a RatrainError), and a good split passes as a tuple."""

import pytest

from ratrain.config import Plan
from ratrain.errors import RatrainError


def _plan(**kw) -> Plan:
    return Plan(**{"pp": 3, "dp": 1, "global_batch": 8, "seq": 16, **kw})


@pytest.mark.parametrize(
    "split,where",
    [((1, 0, 1), 1), ((1, True, 1), 1), ((1, 2.0, 1), 1), ((-1, 2, 1), 0), ((1, 2, -1), 2)],
)
def test_a_bad_layer_split_names_its_entry(split, where):
    with pytest.raises(RatrainError, match=rf"layer_split\[{where}\]"):
        _plan(layer_split=split)


def test_good_splits_and_policies_pass():
    assert _plan(layer_split=[0, 5, 0]).layer_split == (0, 5, 0)  # ends may hold 0 blocks
    assert _plan(pp=1, layer_split=(4,)).layer_split == (4,)
    with pytest.raises(RatrainError, match=r"layer_split\[0\]"):
        _plan(pp=1, layer_split=(0,))  # a lone stage needs a block
    assert _plan(recompute="full").recompute == ("full",) * 3
    with pytest.raises(RatrainError, match="bogus"):
        _plan(recompute=("none", "full", "bogus"))
