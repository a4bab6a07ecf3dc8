"""Small hand-built platforms for the tile planner and the tiled backend tests."""

from ratrain.platforms import Link, Platform, Tier

KIB = 1024


def make_platform(tiers, peak=1e12, name="test", usable_bytes=10**9):
    link = Link(1e9, 1e-6)
    return Platform(
        name=name,
        usable_memory_bytes=usable_bytes,
        workspace_bytes=0,
        peak_flops={"fp16": peak, "bf16": peak, "fp32": peak / 2},
        efficiency=0.5,
        tiers=tuple(tiers),
        host=link,
        intra_node=link,
        inter_node=link,
        units_per_node=1,
    )


# Small tiers, so that every dimension is cut into several tiles with ragged edges.
THREE = make_platform(
    [
        Tier("l1", 16 * KIB, 50e9, 1e-6, 4),
        Tier("l2", 64 * KIB, 40e9, 1e-6, 1),
        Tier("mem", 10**9, 10e9, 1e-6, 1),
    ]
)
