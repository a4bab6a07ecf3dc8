"""--memory-cap at or below the platform's workspace reservation leaves nothing for the
model: plan and simulate say so in one line (both figures, what to do), exit 2."""

from __future__ import annotations

import pytest
import yaml

from _cli import one_line_error
from ratrain.platforms import load

WORKSPACE_GIB = load("mt3000").workspace_bytes / 2**30  # 0.466 GiB (0.5 GB)


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "--model", "tiny", "--platform", "mt3000", "--clusters", "2"],
        ["simulate", "--model", "tiny", "--platform", "mt3000", "--pp", "2"],
    ],
)
@pytest.mark.parametrize("cap", ["0.01", f"{WORKSPACE_GIB:.9f}"])
def test_a_cap_below_the_workspace_is_one_line(capfd, argv, cap):
    line = one_line_error(
        capfd,
        [*argv, "--memory-cap", cap],
        f"--memory-cap {float(cap):g} GiB",
        "workspace",
        f"{WORKSPACE_GIB:.3g} GiB",
        "mt3000",
        "raise --memory-cap above",
    )
    assert "no plan fits" not in line and "-0." not in line, line


def test_a_plan_file_planned_under_a_cap_below_the_workspace(tmp_path, capfd):
    plan = tmp_path / "p.yaml"
    plan.write_text(
        yaml.safe_dump(
            {"plan": {"pp": 2, "micro_batch": 1, "global_batch": 4}, "memory_cap_gib": 0.01}
        )
    )
    one_line_error(
        capfd,
        ["simulate", "--model", "tiny", "--platform", "mt3000", "--plan", str(plan)],
        "0.01 GiB",
        "workspace",
        "raise --memory-cap above",
    )


def test_a_cap_above_the_workspace_still_plans(capsys):
    from ratrain.cli import main

    argv = ["simulate", "--model", "tiny", "--platform", "mt3000", "--pp", "2"]
    assert main([*argv, "--memory-cap", "0.6"]) == 0
