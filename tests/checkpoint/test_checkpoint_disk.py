"""A disk that fills up during a save: one line naming the checkpoint's path and the bytes it
needs, the partial save removed (nothing `--resume auto` could pick), the previous
checkpoint intact and loadable. Injected inside DCP's write (`RATRAIN_FAULT=R:S:save-enospc`)
and, where this process may mount one, on a real tiny tmpfs."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from ratrain.checkpoint import complete_checkpoints, read_meta
from ratrain.checkpoint.io import checkpoint_bytes
from ratrain.checkpoint.read import read_tensors
from ratrain.cli import main
from ratrain.models.presets import get_preset

pytestmark = pytest.mark.dist

ARGS = [
    "train", "--pp", "2", "--seq", "16", "--micro-batch", "1", "--global-batch", "4",
    "--dtype", "fp32", "--steps", "6", "--lr", "3e-3", "--warmup", "2", "--quiet",
    "--threads", "1",
]  # fmt: skip
NEED = checkpoint_bytes(get_preset("tiny"))


def _losses(path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, path.read_text().splitlines())}


def _disk_full_line(capfd, argv) -> str:
    assert main(argv) == 1  # a failed job, not a user mistake
    err = capfd.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert "no space left on the device saving checkpoint" in err, err
    assert f"needs about {NEED / 2**20:,.1f} MiB ({NEED:,} bytes)" in err, err
    return err


def _only_previous_left(save) -> None:
    assert [c.name for c in complete_checkpoints(save)] == ["step-00000002"]
    assert (save / "latest").read_text().strip() == "step-00000002"
    assert sorted(p.name for p in save.iterdir()) == ["latest", "step-00000002"]
    assert read_meta(save / "step-00000002")["step"] == 2


@pytest.mark.timeout(300)
def test_disk_full_inside_the_dcp_write(tmp_path, capfd, monkeypatch):
    m0 = tmp_path / "m0.jsonl"
    assert main([*ARGS, "--metrics", str(m0)]) == 0
    save, m = tmp_path / "ck", tmp_path / "m.jsonl"
    argv = [*ARGS, "--save", str(save), "--save-every", "2", "--metrics", str(m)]
    monkeypatch.setenv("RATRAIN_FAULT", "1:4:save-enospc")
    err = _disk_full_line(capfd, argv)
    monkeypatch.delenv("RATRAIN_FAULT")
    assert f"checkpoint {save / 'step-00000004'}:" in err, err
    assert f"last complete checkpoint {save / 'step-00000002'}" in err, err
    _only_previous_left(save)
    assert main([*argv, "--resume", "auto"]) == 0  # the previous one loads and continues
    assert "step-00000002" in capfd.readouterr().out
    assert _losses(m) == _losses(m0)  # bit for bit


def _mount_tmpfs(where, size: int) -> str | None:
    """None when mounted, else why not."""
    if os.geteuid() != 0:
        return "not root"
    where.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    return None if r.returncode == 0 else (r.stderr.strip() or "mount failed")


@pytest.mark.timeout(300)
def test_disk_full_on_a_real_tmpfs(tmp_path, capfd):
    disk = tmp_path / "disk"
    # room for one checkpoint (DCP adds headers and .metadata, ~10% here), not for two
    why = _mount_tmpfs(disk, int(1.5 * NEED))
    if why is not None:
        pytest.skip(f"cannot mount a tmpfs here ({why})")
    try:
        save = disk / "ck"
        err = _disk_full_line(capfd, [*ARGS, "--save", str(save), "--save-every", "2"])
        assert f"checkpoint {save / 'step-00000004'}:" in err and "free there" in err, err
        _only_previous_left(save)
        tensors = read_tensors(save / "step-00000002", "model/")  # loadable
        assert tensors and all(t.numel() for t in tensors.values())
    finally:
        subprocess.run(["umount", str(disk)], check=False)
    assert not os.path.ismount(disk)
