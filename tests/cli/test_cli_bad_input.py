"""A bad value of any flag of any command is one line on stderr and exit code 2, before any
work: no traceback, no training, no planning, no measuring, and no output file touched.

Every flag that takes a value has a case here or in test_bad_input_audit.py (the table of
benchmarks/bad_input_audit.py: prepare, eval, generate, emulate, bench cluster, link-probe,
plot, job files, plan and platform files, prepared data). `{file}`, `{dir}` and `{tmp}` stand for a
regular file, a folder and an empty folder of the test's own; `no_work` makes every entry
point of real work fail the test if it is reached."""

import pytest

from _audit import load_audit
from ratrain.cli import main

BIG = "99999999999999999999"  # more than 2**63 - 1

TRAIN = ["train", "--steps", "1", "--quiet"]
SIMULATE = ["simulate", "--model", "tiny"]
PLAN = ["plan", "--model", "tiny", "--clusters", "2", "--platform", "cpu-local", "--quiet"]
VERIFY = ["verify", "--quiet"]
BENCH = ["bench", "paper", "--quiet"]
EXPORT = ["export", "{dir}", "--hf", "{tmp}/hf"]
CALIBRATE = ["calibrate", "--no-progress", "-o", "{tmp}/c.yaml"]
VALIDATE = ["validate", "--platform", "cpu-local"]
EMULATE = ["emulate", "--raw"]
LINK_PROBE = ["link-probe", "{tmp}/links.json", "--ranks-per-node", "2"]

# (flag, bad value) of the plan flags simulate, train and verify share
PLAN_FLAGS = [
    ("--model", ""),
    ("--plan", "{dir}"),
    ("--pp", "0"),
    ("--dp", "-1"),
    ("--micro-batch", "abc"),
    ("--global-batch", "1000000000000"),  # 10**12 microbatches: a schedule never built
    ("--seq", "100000"),
    ("--schedule", "xyz"),
    ("--recompute", ""),
    ("--layer-split", "1,,2"),
    ("--view-policy", "xyz"),
    ("--view-lookahead", "-1"),
    ("--dtype", "fp8"),
    ("--grad-dtype", "int8"),
    ("--clip-grad", "nan"),
    ("--loss-chunk-tokens", "0"),
    ("--sync-bucket-bytes", "-1"),
]

CASES = [
    *[(TRAIN, [f, v]) for f, v in PLAN_FLAGS],
    (TRAIN, ["--pp", BIG]),
    (TRAIN, ["--steps", "-1"]),
    (TRAIN, ["--lr", "inf"]),
    (TRAIN, ["--min-lr", "nan"]),
    (TRAIN, ["--warmup", "-1"]),
    (TRAIN, ["--weight-decay", "nan"]),
    (TRAIN, ["--seed", "-1"]),
    (TRAIN, ["--backend", "abc"]),
    (TRAIN, ["--malloc-mmap-threshold", "-1"]),
    (TRAIN, ["--threads", "100000"]),
    (TRAIN, ["--nproc", "0"]),
    (TRAIN, ["--timeout", "nan"]),
    (TRAIN, ["--timeout", "1e300"]),
    (TRAIN, ["--data", "{tmp}/none.txt"]),
    (TRAIN, ["--tokenizer", "{tmp}/none.json"]),
    (TRAIN, ["--tokenizer", "{dir}"]),  # a folder without tokenizer.json
    (TRAIN, ["--data-dtype", "int8"]),
    (TRAIN, ["--metrics", "{file}/m.jsonl"]),
    (TRAIN, ["--tensorboard", "/proc/x"]),
    (TRAIN, ["--save", "{file}"]),
    (TRAIN, ["--save-every", "0"]),
    (TRAIN, ["--keep", "-1"]),
    (TRAIN, ["--resume", "{tmp}/none"]),
    (TRAIN, ["--init-from", "{tmp}/none"]),
    *[(SIMULATE, [f, v]) for f, v in PLAN_FLAGS if f != "--model"],
    (SIMULATE, ["--model", "abc"]),
    (SIMULATE, ["--dp", "100000000", "--global-batch", "100000000"]),  # 10**8 ranks
    (SIMULATE, ["--platform", ""]),
    (SIMULATE, ["--rank-layout", "xyz"]),
    (SIMULATE, ["--trace", "{dir}"]),
    (SIMULATE, ["--trace", "/proc/version"]),
    (SIMULATE, ["--plot", "{tmp}/p.txt"]),
    (PLAN, ["--model", ""]),
    (PLAN, ["--platform", "{tmp}/none.yaml"]),
    (PLAN, ["--clusters", "0"]),
    (PLAN, ["--clusters", "2000000"]),
    (PLAN, ["--global-batch", "-1"]),
    (PLAN, ["--global-batch", "10000000"]),
    (PLAN, ["--global-batch-tokens", "1000"]),
    (PLAN, ["--seq", "0"]),
    (PLAN, ["--pin", "pp=0"]),
    (PLAN, ["--pin", "clip_grad=abc"]),
    (PLAN, ["--pin", "micro_batch=-2"]),
    (PLAN, ["--family", "xyz"]),
    (PLAN, ["--top", "0"]),
    (PLAN, ["-o", "{dir}"]),
    (PLAN, ["--plot", "{tmp}/m.txt"]),
    (PLAN, ["--time-budget", "nan"]),
    *[(VERIFY, [f, v]) for f, v in PLAN_FLAGS],
    (VERIFY, ["--tokens", "0"]),
    (VERIFY, ["--steps", "abc"]),
    (VERIFY, ["--lr", "-1"]),
    (VERIFY, ["--seed", "-1"]),
    (VERIFY, ["--data", "{tmp}/none.txt"]),
    (VERIFY, ["--tolerance", "nan"]),
    (VERIFY, ["--memory-cap", "inf"]),
    (VERIFY, ["--device", "tpu"]),
    (VERIFY, ["--timeout", "0"]),
    (["bench", "xyz"], []),
    (BENCH, ["--out", "{file}"]),
    (BENCH, ["--platform", ""]),
    (BENCH, ["--models", "tiny,,llama2-7b"]),
    (BENCH, ["--models", "abc"]),
    (BENCH, ["--clusters", "abc"]),
    (BENCH, ["--clusters", "8,2000000"]),
    (["export", "{tmp}/none", "--hf", "{tmp}/hf"], []),
    (EXPORT, ["--hf", "{file}/sub"]),
    (EXPORT, ["--dtype", "xyz"]),
    (EXPORT, ["--max-shard-gb", "inf"]),
    (["calibrate", "-o", "{tmp}/c.txt"], []),
    (["calibrate", "-o", "{file}/c.yaml"], []),
    (CALIBRATE, ["--device", "tpu"]),
    (CALIBRATE, ["--nproc", "0"]),
    (CALIBRATE, ["--nproc", "100000"]),
    (CALIBRATE, ["--budget-s", "inf"]),
    (CALIBRATE, ["--windows", "0"]),
    (CALIBRATE, ["--max-spread", "nan"]),
    (CALIBRATE, ["--dtypes", "bf16"]),
    (CALIBRATE, ["--name", ""]),
    (CALIBRATE, ["--description", ""]),
    (CALIBRATE, ["--merge", "{tmp}/a.yaml", "{tmp}/b.yaml"]),
    (VALIDATE, ["--platform", ""]),
    (VALIDATE, ["--grid", "{tmp}/none.yaml"]),
    (VALIDATE, ["--steps", "0"]),
    (VALIDATE, ["--warmup", "-1"]),
    (VALIDATE, ["--passes", "0"]),
    (VALIDATE, ["--max-ranks", "abc"]),
    (VALIDATE, ["--rescore", ""]),
    (VALIDATE, ["--plot", "{tmp}/v.txt"]),
    (EMULATE, ["--nodes", "0"]),
    (EMULATE, ["--ranks-per-node", "abc"]),
    (EMULATE, ["--link-mbit", "nan"]),
    (EMULATE, ["--latency-ms", "-1"]),
    (EMULATE, ["--master-port", "0"]),
    (EMULATE, ["--timeout", "0"]),
    (EMULATE, ["--max-restarts", "-1"]),
    (["link-probe", "{tmp}/links.json"], []),
    (LINK_PROBE, ["--ranks-per-node", "0"]),
    (LINK_PROBE, ["--reps", "abc"]),
]


def _id(case) -> str:
    base, extra = case
    return " ".join([*base[:2], *extra]).replace("{", "").replace("}", "")[:60]


@pytest.fixture
def no_work(monkeypatch):
    """Every entry point of real work (the audit's list, `guard_work`: ranks, the reference
    trainer, the simulator, the planner, the paper's benchmark, calibration's measurements,
    validate's runs, ...) fails the test if a bad value lets a command reach it; so does
    reading a checkpoint's weights, which none of these cases needs (some of the audit's
    cases with a checkpoint read them before they refuse)."""
    import ratrain.calibrate.load as cal_load
    import ratrain.checkpoint.read as ckpt_read

    def work(*a, **k):
        raise AssertionError("a bad value started real work")

    monkeypatch.setattr(ckpt_read, "read_model_weights", work)
    monkeypatch.setattr(cal_load, "others_share_now", lambda s=1.0: 0.0)
    with load_audit().guard_work():
        yield


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_bad_value_is_one_line_and_exit_2_before_any_work(case, tmp_path, capsys, no_work):
    (tmp_path / "a-file").write_text("not a folder, not a plan\n")
    (tmp_path / "a-dir").mkdir()
    (tmp_path / "tmp").mkdir()
    paths = {
        "file": str(tmp_path / "a-file"),
        "dir": str(tmp_path / "a-dir"),
        "tmp": str(tmp_path / "tmp"),
    }
    base, extra = case
    argv = [a.format(**paths) for a in [*base, *extra]]
    rc = main(argv)
    cap = capsys.readouterr()
    lines = [line for line in cap.err.splitlines() if line.strip()]
    assert rc == 2, (argv, cap.err)
    assert len(lines) == 1 and "Traceback" not in cap.err, (argv, cap.err)
    assert lines[0].startswith(f"ratrain {argv[0]}: error: "), lines[0]
    assert (tmp_path / "a-file").read_text() == "not a folder, not a plan\n"
    assert not list((tmp_path / "a-dir").iterdir())


def test_an_existing_output_is_not_touched_by_an_error(tmp_path, capsys, no_work):
    """-o names a plan file that exists; --pin is bad: the file keeps its bytes."""
    out = tmp_path / "plan.yaml"
    out.write_text("plan: {pp: 1}\n")
    assert main([*PLAN, "--pin", "pp=0", "-o", str(out)]) == 2
    assert out.read_text() == "plan: {pp: 1}\n"


def test_pins_are_checked_as_the_plan_fields_they_set(capsys, no_work):
    assert main([*PLAN, "--pin", "pp=0"]) == 2
    assert "--pin pp=0: pp must be a positive integer" in capsys.readouterr().err
    assert main([*PLAN, "--pin", "view_lookahead=-1"]) == 2
    assert "view_lookahead must be >= 0" in capsys.readouterr().err


def test_too_many_microbatches_names_what_to_change(capsys, no_work):
    assert main([*SIMULATE, "--global-batch", "1000000000000"]) == 2
    err = capsys.readouterr().err
    assert "1,000,000,000,000 microbatches per step" in err and "--micro-batch" in err
    assert main([*PLAN, "--global-batch", "1000000007"]) == 2
    err = capsys.readouterr().err
    assert "microbatches per step" in err and "more divisors" in err
