import json

import numpy as np
import pytest
import torch

from ratrain.cli import main

SMALL = ["--seq", "16", "--micro-batch", "2", "--global-batch", "4", "--quiet"]


@pytest.mark.timeout(120)
def test_train_writes_metrics_and_summary(tmp_path, capsys):
    path = tmp_path / "m.jsonl"
    threads = torch.get_num_threads()
    rc = main(["train", "--steps", "3", "--metrics", str(path), "--threads", "1", *SMALL])
    assert rc == 0
    assert torch.get_num_threads() == threads  # restored
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert {"loss", "lr", "grad_norm", "tokens_per_s", "step_time_s"} <= set(rows[0])
    out = capsys.readouterr().out
    assert "training tiny" in out and "synthetic Markov chain" in out
    assert "final loss" in out and "entropy floor" in out and "3 steps in" in out


@pytest.mark.timeout(120)
@pytest.mark.timeout(180)
def test_train_defaults_with_progress():
    # The built-in job's defaults (tiny, synthetic, 32 x 64 tokens, pp=2 on 2 local ranks),
    # cut to two steps. A subprocess, because the progress line comes from a rank process.
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "ratrain", "train", "--steps", "2"],
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert r.returncode == 0, r.stderr
    assert "2 steps x 32 seqs x 64 tokens" in r.stdout and "fp32" in r.stdout
    assert "pp=2" in r.stdout and "(2 ranks)" in r.stdout
    assert "2/2" in r.stderr and "loss" in r.stderr  # the progress line


@pytest.mark.timeout(120)
def test_train_on_text_and_tokens(tmp_path, capsys):
    (tmp_path / "c.txt").write_text("the quick brown fox jumps over the lazy dog. " * 40)
    assert main(["train", "--steps", "2", "--data", str(tmp_path / "c.txt"), *SMALL]) == 0
    out = capsys.readouterr().out
    assert "c.txt (bytes)" in out and "final loss" in out and "entropy floor" not in out
    (np.arange(500, dtype=np.uint32) % 256).tofile(tmp_path / "t.u32")
    assert main(["train", "--steps", "2", "--data", str(tmp_path / "t.u32"), *SMALL]) == 0
    assert "t.u32 (uint32)" in capsys.readouterr().out


@pytest.mark.parametrize(
    "flags, match",
    [
        (["--steps", "0"], "--steps must be a positive integer"),
        (["--lr", "-1"], "argument --lr: expected a finite positive number"),
        (["--warmup", "-3"], "argument --warmup: expected an integer >= 0"),
        (["--weight-decay", "-0.1"], "argument --weight-decay: expected a finite number >= 0"),
        (["--data", "nope.txt"], "not found"),
        (["--nproc", "3"], "does not match pp x dp"),
        (["--nproc", "0"], "argument --nproc: expected a positive integer"),
        (["--threads", "0"], "argument --threads: expected a positive integer"),
        (["--seq", "4096"], "max_seq"),
        (["--model", "no-such-model"], "unknown model preset"),
        (["--global-batch", "33"], "not a multiple"),
    ],
)
def test_bad_flags_one_line_error(flags, match, capsys):
    assert main(["train", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ratrain train: error:") and match in err[0]


def test_bad_data_file_one_line_error(tmp_path, capsys):
    (tmp_path / "big.bin").write_bytes(np.array([1, 999], dtype=np.uint16).tobytes())
    assert main(["train", "--data", str(tmp_path / "big.bin"), *SMALL]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "token id 999" in err[0]


@pytest.mark.timeout(120)
def test_memory_cap_refuses_before_any_work_and_sits_beside_the_peak(capsys):
    assert main(["train", "--steps", "2", "--memory-cap", "0.001", *SMALL]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # refused before the header, before any rank
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "plan does not fit" in err[0] and "--memory-cap" in err[0]
    assert main(["train", "--steps", "2", "--memory-cap", "1", *SMALL]) == 0
    out = capsys.readouterr().out
    assert "peak" in out and "per rank" in out and "(--memory-cap 1 GiB per rank)" in out


def test_memory_cap_bad_value(capsys):
    assert main(["train", "--memory-cap", "0"]) == 2
    assert "argument --memory-cap: expected a finite positive number" in capsys.readouterr().err


def test_trace_writes_the_measured_step_in_the_simulators_format(tmp_path):
    """--trace: the last step's actions of every stage, named as the schedule names them."""
    out = tmp_path / "t.json"
    argv = ["train", "--model", "tiny", "--pp", "2", "--dp", "1", "--seq", "16"]
    argv += ["--global-batch", "4", "--micro-batch", "1", "--steps", "2", "--quiet"]
    assert main(argv + ["--trace", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["otherData"]["measured"] is True
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    assert {e["pid"] for e in ev} == {0, 1}
    names = {e["name"] for e in ev}
    assert {"0F0@1", "1B3@4"} <= names, sorted(names)[:20]
    assert all(e["dur"] >= 0 for e in ev)
