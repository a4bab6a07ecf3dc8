"""`ratrain plot`: training curves from metrics files. Two synthetic runs make one PNG
(the one with `eval_loss` draws its eval curve, the cap is drawn where a record has it);
a repeated step (a resumed run) keeps its later record; bad input is one line, exit 2."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from _cli import one_line_error
from ratrain.cli import main
from ratrain.errors import RatrainError
from ratrain.observe.curves import plot_curves, read_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _records(steps: int, *, lr: float, eval_every: int | None = None, cap: int | None = None):
    out = []
    for s in range(steps):
        rec = {
            "step": s,
            "loss": 5.5 * (1 - lr) ** s,
            "lr": lr,
            "grad_norm": 1.0,
            "tokens_per_s": 2048 / 0.1,
            "step_time_s": 0.1,
            "peak_bytes_per_rank": [200 * 2**20 + s, 190 * 2**20],
            "peak_bytes_source": "rss",
            "max_rss_bytes_per_rank": [200 * 2**20 + s, 190 * 2**20],
        }
        if eval_every and (s + 1) % eval_every == 0:
            rec["eval_loss"] = rec["loss"] + 0.1
        if cap is not None:
            rec["memory_cap_bytes"] = cap
        out.append(rec)
    return out


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_two_runs_make_one_png_with_the_eval_curve(tmp_path, capsys):
    a = _write(tmp_path / "a.jsonl", _records(20, lr=0.05))
    b = _write(tmp_path / "b.jsonl", _records(20, lr=0.02, eval_every=5, cap=2**30))
    out = tmp_path / "out" / "curves.png"
    assert main(["plot", str(a), str(b), "-o", str(out), "--dpi", "60"]) == 0
    assert "wrote" in capsys.readouterr().out
    data = out.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 1000

    axes = plot_curves([read_run(a), read_run(b, "slow")], tmp_path / "again.png", dpi=40)
    # loss against steps and tokens: a's loss; b's loss and its eval loss
    assert len(axes["loss_steps"].get_lines()) == 3
    assert len(axes["loss_tokens"].get_lines()) == 3
    eval_line = axes["loss_steps"].get_lines()[2]
    assert list(eval_line.get_xdata()) == [4, 9, 14, 19] and eval_line.get_linestyle() == "--"
    # tokens after step s: (s + 1) steps of 2048
    assert axes["loss_tokens"].get_lines()[0].get_xdata()[-1] == 20 * 2048
    assert len(axes["throughput"].get_lines()) == 2
    # two peak lines and b's cap (a horizontal line at 1 GiB)
    mem = axes["memory"].get_lines()
    assert len(mem) == 3 and list(mem[2].get_ydata()) == [1.0, 1.0]
    assert "RSS" in axes["memory"].get_ylabel() and "GiB" in axes["memory"].get_ylabel()
    legend = [t.get_text() for t in axes["loss_steps"].figure.legends[0].get_texts()]
    assert legend[:2] == ["a", "slow"] and "eval loss" in legend


def test_a_repeated_step_keeps_the_later_record(tmp_path):
    first = _records(10, lr=0.05)
    resumed = [dict(r, loss=1.0) for r in _records(10, lr=0.05)[6:]]
    path = _write(tmp_path / "m.jsonl", first + resumed)
    with path.open("a") as f:
        f.write('{"step": 10, "lo')  # cut short by a kill: left out
    run = read_run(path)
    assert [r["step"] for r in run.records] == list(range(10))
    assert [r["loss"] for r in run.records][6:] == [1.0] * 4
    assert run.records[0]["loss"] == first[0]["loss"]


def test_cap_flag_draws_the_cap(tmp_path):
    a = _write(tmp_path / "a.jsonl", _records(5, lr=0.05))
    axes = plot_curves([read_run(a)], tmp_path / "c.png", cap_bytes=0.5 * 2**30, dpi=40)
    assert len(axes["memory"].get_lines()) == 2
    assert list(axes["memory"].get_lines()[1].get_ydata()) == [512, 512]  # MiB below 1 GiB
    assert main(["plot", str(a), "-o", str(tmp_path / "d.png"), "--cap", "0.5"]) == 0


def _bad_inputs(tmp_path: Path):
    good = _write(tmp_path / "good.jsonl", _records(3, lr=0.1))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    text = tmp_path / "notes.jsonl"
    text.write_text("this is not json\nnor is this\n")
    array = tmp_path / "array.jsonl"
    array.write_text("[1, 2, 3]\n")
    png = str(tmp_path / "c.png")
    return [
        ([str(tmp_path / "missing.jsonl"), "-o", png], "no such file"),
        ([str(empty), "-o", png], "no metrics records"),
        ([str(text), "-o", png], "not a JSON line"),
        ([str(array), "-o", png], "not a metrics record"),
        ([str(tmp_path), "-o", png], "is a folder"),
        ([str(good), "-o", str(tmp_path / "c.txt")], "expected a file ending in"),
        ([str(good), "-o", str(good) + "/x.png"], "is a file, not a folder"),
        ([str(good), "-o", str(tmp_path)], "-o"),
        ([str(good), "-o", "/proc/curves.png"], "-o"),
        ([str(good), "-o", png, "--label", "x", "--label", "y"], "--label"),
        ([str(good), "-o", png, "--cap", "0"], "--cap"),
    ]


def test_bad_input_is_one_line_exit_2(tmp_path, capsys):
    for argv, needle in _bad_inputs(tmp_path):
        one_line_error(capsys, ["plot", *argv], needle)
    assert not (tmp_path / "c.png").exists()


def test_a_failed_write_is_one_line(tmp_path):
    good = _write(tmp_path / "good.jsonl", _records(3, lr=0.1))
    with pytest.raises(RatrainError, match="cannot write"):
        plot_curves([read_run(good)], tmp_path / "no-such-folder" / "c.png")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_unwritable_output_is_one_line(tmp_path, capsys):
    good = _write(tmp_path / "good.jsonl", _records(3, lr=0.1))
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        one_line_error(capsys, ["plot", str(good), "-o", str(ro / "c.png")], "-o")
        with pytest.raises(RatrainError, match="cannot write"):
            plot_curves([read_run(good)], ro / "c.png")
    finally:
        ro.chmod(0o700)


def test_plot_imports_no_torch():
    import subprocess
    import sys

    code = "import sys; from ratrain.cli import plot; import ratrain.observe.curves; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_runs_with_the_same_file_name_are_told_apart_by_their_folder():
    from ratrain.cli.plot import _default_labels

    assert _default_labels(["a/m.jsonl", "b/m.jsonl", "c.jsonl"]) == ["a/m", "b/m", "c"]
