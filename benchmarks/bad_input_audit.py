"""Bad input to every command, flag and file ratrain reads: each case must be refused with
one line that says what is wrong, exit code 2, no traceback, before any work, and with every
file that existed left as it was.

    python benchmarks/bad_input_audit.py            # every case, a Markdown table on stdout
    python benchmarks/bad_input_audit.py --fast     # without the cases that need a checkpoint

Each case runs `ratrain ARGV` in-process (`ratrain.cli.main`) against a folder of fixtures
made once (`make_fixtures`: a tokenizer, a prepared data folder and its damaged copies, plan
and platform files with missing, extra or wrong-typed fields, a checkpoint). Every entry
point of real work (ranks, the simulator, the planner, tokenizing, an emulated network,
...) is replaced by one that fails the case (`guard_work`). tests/cli/test_bad_input_audit.py
runs the same table (`CASES`) under pytest.

The table: case | exit code | the first line printed; a case that breaks a rule is marked
and listed at the end, and the script exits 1.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import shutil
import sys
import tempfile
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CASES", "Case", "make_fixtures", "guard_work", "run_case", "snapshot", "main"]

BIG = "99999999999999999999"  # more than 2**63 - 1


@dataclass(frozen=True)
class Case:
    """`ratrain ARGV` (`{name}` stands for fixture `name`'s path) must exit 2 with one line
    holding `needle`."""

    argv: tuple[str, ...]
    needle: str
    needs: frozenset[str] = frozenset()
    """Fixtures that are slow to make ("ckpt": a checkpoint, about 15 s)."""

    @property
    def name(self) -> str:
        return " ".join(self.argv)


def _c(argv: str | list[str], needle: str, *, needs: tuple[str, ...] = ()) -> Case:
    return Case(tuple(argv.split() if isinstance(argv, str) else argv), needle, frozenset(needs))


TRAIN = "train --steps 1 --quiet "
SIM = "simulate --model tiny "
PLAN = "plan --model tiny --clusters 2 --platform mt3000 --quiet "
PREP = "prepare {txt} --tokenizer {tok} --workers 1 --quiet "
EVAL = "eval {ckpt} "
GEN = "generate {ckpt} --prompt hello "
EMU = "emulate --raw "
BCL = "bench cluster --quiet --predict --base-platform mt3000 "

CASES: list[Case] = [
    # -- prepare ----------------------------------------------------------------------------
    _c("prepare {tmp}/none.txt --tokenizer {tok} -o {tmp}/p", "not found"),
    _c("prepare {dir} --tokenizer {tok} -o {tmp}/p", "folder"),
    _c("prepare {file} --tokenizer {tok} -o {tmp}/p", ".jsonl"),
    _c(PREP + "-o {file}", "not a directory"),
    _c(PREP + "-o {prep}/manifest.json", "not a directory"),
    _c("prepare {txt} --tokenizer {tok_empty} -o {tmp}/p", "tokenizer"),
    _c("prepare {txt} --tokenizer {tok_garbage} -o {tmp}/p", "cannot read tokenizer"),
    _c("prepare {txt} --tokenizer {tok_binary} -o {tmp}/p", "cannot read tokenizer"),
    _c("prepare {txt} --tokenizer {tok_isdir} -o {tmp}/p", "tokenizer"),
    _c("prepare {txt} --tokenizer {tmp}/none -o {tmp}/p", "not found"),
    _c(["prepare", "{txt}", "--tokenizer", "", "-o", "{tmp}/p"], "empty string"),
    _c(PREP + "-o {tmp}/p --val-fraction 1", "--val-fraction"),
    _c(PREP + "-o {tmp}/p --val-fraction 1.5", "--val-fraction"),
    _c(PREP + "-o {tmp}/p --val-fraction nan", "--val-fraction"),
    _c(PREP + "-o {tmp}/p --val-fraction -0.1", "--val-fraction"),
    _c(PREP + "-o {tmp}/p --val-tokens -1", "--val-tokens"),
    _c(PREP + "-o {tmp}/p --val-tokens 5 --val-fraction 0.1", "not allowed with"),
    _c(PREP + "-o {tmp}/p --seed -1", "--seed"),
    _c(PREP + f"-o {{tmp}}/p --seed {BIG}", "--seed"),
    _c(PREP + "-o {tmp}/p --workers 0", "--workers"),
    _c(PREP + "-o {tmp}/p --workers 100000", "--workers"),
    _c(PREP + "-o {tmp}/p --txt-docs xyz", "--txt-docs"),
    _c(["prepare", "{txt}", "--tokenizer", "{tok}", "-o", "{tmp}/p", "--field", ""], "--field"),
    _c("prepare {txt} -o {tmp}/p", "--tokenizer"),
    # -- eval -------------------------------------------------------------------------------
    _c("eval {tmp}/none --data synthetic", "no such checkpoint"),
    _c("eval {file} --data synthetic", "not a directory"),
    _c("eval {dir} --data synthetic", "CKPT"),
    _c(EVAL + "--data {tmp}/none.txt", "not found", needs=("ckpt",)),
    _c(EVAL + "--data {prep_val_short}", "shorter", needs=("ckpt",)),
    _c(EVAL + "--data synthetic --pp 8", "pp", needs=("ckpt",)),
    _c(EVAL + "--data synthetic --plan {plan_extra}", "unknown field", needs=("ckpt",)),
    _c(EVAL + "--data {text} --tokenizer {tok_empty}", "tokenizer", needs=("ckpt",)),
    _c("eval {tmp}/c --data synthetic --eval-tokens 0", "--eval-tokens"),
    _c(f"eval {{tmp}}/c --data synthetic --eval-tokens {BIG}", "--eval-tokens"),
    _c("eval {tmp}/c --data synthetic --pp 0", "--pp"),
    _c("eval {tmp}/c --data synthetic --dp abc", "--dp"),
    _c("eval {tmp}/c --data synthetic --seed -1", "--seed"),
    _c("eval {tmp}/c --data synthetic --timeout 0", "--timeout"),
    _c("eval {tmp}/c --data synthetic --device tpu", "--device"),
    _c("eval {tmp}/c --data synthetic --data-dtype int8", "--data-dtype"),
    _c(["eval", "{tmp}/c", "--data", ""], "--data"),
    _c("eval {tmp}/c", "--data"),
    # -- generate ---------------------------------------------------------------------------
    _c("generate {tmp}/none --prompt hi", "not found"),
    _c("generate {file} --prompt hi", "checkpoint"),
    _c("generate {dir} --prompt hi", "checkpoint"),
    _c(["generate", "{tmp}/m", "--prompt", ""], "--prompt"),
    _c("generate {tmp}/m", "--prompt"),
    _c("generate {tmp}/m --prompt hi --max-new-tokens 0", "--max-new-tokens"),
    _c(f"generate {{tmp}}/m --prompt hi --max-new-tokens {BIG}", "--max-new-tokens"),
    _c("generate {tmp}/m --prompt hi --temperature -1", "--temperature"),
    _c("generate {tmp}/m --prompt hi --temperature nan", "--temperature"),
    _c("generate {tmp}/m --prompt hi --temperature inf", "--temperature"),
    _c("generate {tmp}/m --prompt hi --top-k 0", "--top-k"),
    _c("generate {tmp}/m --prompt hi --top-p 0", "--top-p"),
    _c("generate {tmp}/m --prompt hi --top-p 1.5", "--top-p"),
    _c("generate {tmp}/m --prompt hi --top-p nan", "--top-p"),
    _c("generate {tmp}/m --prompt hi --seed -1", "--seed"),
    _c(f"generate {{tmp}}/m --prompt hi --seed {BIG}", "--seed"),
    _c("generate {tmp}/m --prompt hi --threads 0", "--threads"),
    _c("generate {tmp}/m --prompt hi --threads 100000", "--threads"),
    _c(["generate", "{tmp}/m", "--prompt", "hi", "--tokenizer", ""], "--tokenizer"),
    _c(GEN + "--tokenizer {tok_empty}", "tokenizer", needs=("ckpt",)),
    _c(GEN + "--tokenizer {tok_garbage}", "tokenizer", needs=("ckpt",)),
    _c(GEN + "--tokenizer {tok_binary}", "tokenizer", needs=("ckpt",)),
    _c(GEN + "--tokenizer {tok_isdir}", "tokenizer", needs=("ckpt",)),
    _c(GEN, "tokenizer", needs=("ckpt",)),
    _c(GEN + "--tokenizer {tok_big}", "vocabulary", needs=("ckpt",)),
    # -- emulate / cluster ------------------------------------------------------------------
    _c(EMU + "--nodes 0 -- true", "--nodes"),
    _c(EMU + "--nodes 100000 -- true", "--nodes"),
    _c(EMU + "--ranks-per-node 0 -- true", "--ranks-per-node"),
    _c(EMU + "--ranks-per-node 100000 -- true", "--ranks-per-node"),
    _c(EMU + "--link-mbit 0 -- true", "--link-mbit"),
    _c(EMU + "--link-mbit nan -- true", "--link-mbit"),
    _c(EMU + "--link-mbit inf -- true", "--link-mbit"),
    _c(EMU + "--link-mbit 1e300 -- true", "--link-mbit"),
    _c(EMU + "--latency-ms 0 -- true", "--latency-ms"),
    _c(EMU + "--latency-ms 1e300 -- true", "--latency-ms"),
    _c(EMU + "--master-port 0 -- true", "--master-port"),
    _c(EMU + "--master-port 65536 -- true", "--master-port"),
    _c(EMU + "--master-port -1 -- true", "--master-port"),
    _c(EMU + "--timeout 0 -- true", "--timeout"),
    _c(EMU + "--timeout nan -- true", "--timeout"),
    _c(EMU + "--max-restarts -1 -- true", "--max-restarts"),
    _c(EMU + f"--max-restarts {BIG} -- true", "--max-restarts"),
    _c("emulate", "no command"),
    _c("emulate --", "no command"),
    _c("cluster --nodes 0 -- true", "--nodes"),
    _c("cluster --master-port 70000 -- train", "--master-port"),
    _c("cluster", "no command"),
    _c("cluster -- train --pp 0", "--pp"),
    _c("emulate --nodes 2 -- train --glob 2", "--global-batch"),
    _c("emulate -- eval", "--data"),
    _c("emulate -- xyz", "not a ratrain command"),
    _c("cluster -- link-probe {tmp}/l.json --ranks-per-node 0", "--ranks-per-node"),
    # -- bench cluster ----------------------------------------------------------------------
    _c(BCL + "--caps 0", "--caps"),
    _c(BCL + "--caps abc", "--caps"),
    _c(BCL + "--caps inf", "--caps"),
    _c(BCL + "--caps nan", "--caps"),
    _c(["bench", "cluster", "--predict", "--caps", ""], "--caps"),
    _c(BCL + "--link-mbit 0", "--link-mbit"),
    _c(BCL + "--link-mbit inf", "--link-mbit"),
    _c(BCL + "--link-mbit 100,,abc", "--link-mbit"),
    _c(BCL + "--nodes 0", "--nodes"),
    _c(BCL + "--ranks-per-node 0", "--ranks-per-node"),
    _c(BCL + "--ranks-per-node 100000", "--ranks-per-node"),
    _c(BCL + "--seq 0", "--seq"),
    _c(BCL + "--global-batch 0", "--global-batch"),
    _c(BCL + "--peer-layouts 0x2", "--peer-layouts"),
    _c(BCL + "--peer-layouts 2by2", "--peer-layouts"),
    _c(["bench", "cluster", "--peer-layouts", ""], "--peer-layouts"),
    _c(BCL + "--steps 0", "--steps"),
    _c(BCL + "--warmup -1", "--warmup"),
    _c(BCL + "--warmup abc", "--warmup"),
    _c(BCL + "--repeats 0", "--repeats"),
    _c(BCL + "--systems xyz", "--systems"),
    _c(BCL + "--systems ratrain,,x", "--systems"),
    _c(BCL + "--model abc", "abc"),
    _c(["bench", "cluster", "--predict", "--model", ""], "--model"),
    _c("bench cluster --quiet --predict --base-platform {tmp}/none.yaml", "not found"),
    _c("bench cluster --quiet --predict --base-platform {platform_missing}", "missing"),
    _c("bench cluster --quiet --from-json {tmp}/none.json", "--from-json"),
    _c("bench cluster --quiet --from-json {file}", "--from-json"),
    _c("bench cluster --quiet --from-json {dir}", "--from-json"),
    _c("bench cluster --quiet --json {dir}", "--json"),
    _c("bench cluster --quiet --json {file}/x.json", "--json"),
    _c("bench cluster --quiet --out {file}", "--out"),
    _c("bench cluster --quiet --warmup 6 --steps 6", "--warmup"),
    _c("bench cluster --quiet --peer-layouts 3x1", "--peer-layouts"),
    # -- link-probe -------------------------------------------------------------------------
    _c("link-probe {dir} --ranks-per-node 2", "folder"),
    _c("link-probe {file}/x.json --ranks-per-node 2", "is a file"),
    _c(["link-probe", "", "--ranks-per-node", "2"], "empty string"),
    _c("link-probe {tmp}/l.json --ranks-per-node 0", "--ranks-per-node"),
    _c("link-probe {tmp}/l.json --ranks-per-node 100000", "--ranks-per-node"),
    _c("link-probe {tmp}/l.json --ranks-per-node 2 --reps 0", "--reps"),
    _c("link-probe {tmp}/l.json", "--ranks-per-node"),
    # -- plot -------------------------------------------------------------------------------
    _c("plot {tmp}/none.jsonl -o {tmp}/c.png", "no such file"),
    _c("plot {dir} -o {tmp}/c.png", "folder"),
    _c("plot {file} -o {tmp}/c.png", "not a JSON line"),
    _c("plot {metrics} -o {tmp}/c.txt", "-o"),
    _c("plot {metrics} -o {dir}", "-o"),
    _c("plot {metrics} -o {file}/c.png", "is a file"),
    _c("plot {metrics} -o {out_png} --cap 0", "--cap"),
    _c("plot {metrics} -o {out_png} --cap nan", "--cap"),
    _c("plot {metrics} -o {out_png} --cap inf", "--cap"),
    _c("plot {metrics} -o {out_png} --dpi 0", "--dpi"),
    _c("plot {metrics} -o {out_png} --dpi abc", "--dpi"),
    _c("plot {metrics} -o {out_png} --dpi 1000000", "--dpi"),
    _c("plot {metrics} -o {out_png} --label a --label b", "--label"),
    _c(["plot", "{metrics}", "-o", "{out_png}", "--label", ""], "--label"),
    _c("plot {file} -o {out_png}", "not a JSON line"),
    _c("plot {metrics} -o", "-o"),
    # -- train --config / --print-config (job files) ----------------------------------------
    _c(TRAIN + "--config {tmp}/none.yaml", "--config"),
    _c(TRAIN + "--config {dir}", "folder"),
    _c(TRAIN + "--config {job_garbage}", "--config"),
    _c(TRAIN + "--config {job_list}", "sections"),
    _c(TRAIN + "--config {job_section}", "unknown key"),
    _c(TRAIN + "--config {job_key}", "unknown key"),
    _c(TRAIN + "--config {job_misplaced}", "belongs under"),
    _c(TRAIN + "--config {job_pp0}", "plan.pp"),
    _c(TRAIN + "--config {job_ppstr}", "plan.pp"),
    _c(TRAIN + "--config {job_ppbool}", "plan.pp"),
    _c(TRAIN + "--config {job_lrlist}", "training.lr"),
    _c(TRAIN + "--config {job_quiet}", "output.quiet"),
    _c(TRAIN + "--config {job_keys_list}", "plan"),
    _c(TRAIN + "--config {job_toml}", "TOML"),
    _c(["train", "--config", ""], "--config"),
    _c(TRAIN + "--print-config {dir}", "--print-config"),
    _c(TRAIN + "--print-config {file}/job.yaml", "--print-config"),
    _c(TRAIN + "--print-config {out_yaml} --pp 0", "--pp"),
    _c(TRAIN + "--print-config {out_yaml} --config {job_pp0}", "plan.pp"),
    _c(["train", "--print-config", ""], "--print-config"),
    # -- the flags added since the last audit -------------------------------------------------
    _c(TRAIN + "--memory-cap 0", "--memory-cap"),
    _c(TRAIN + "--memory-cap -1", "--memory-cap"),
    _c(TRAIN + "--memory-cap nan", "--memory-cap"),
    _c(TRAIN + "--memory-cap inf", "--memory-cap"),
    _c(TRAIN + "--memory-cap 0.01", "--memory-cap"),
    _c(SIM + "--memory-cap 0.01", "workspace"),
    _c(PLAN + "--memory-cap 0.01", "workspace"),
    _c(PLAN + "--memory-cap abc", "--memory-cap"),
    _c(TRAIN + "--host-allocator xyz", "--host-allocator"),
    _c(["train", "--host-allocator", ""], "--host-allocator"),
    _c(TRAIN + "--trace {dir}", "--trace"),
    _c(TRAIN + "--trace {file}/t.json", "--trace"),
    _c(["train", "--steps", "1", "--trace", ""], "--trace"),
    _c(SIM + "--trace {dir}", "--trace"),
    _c(SIM + "--trace {file}/t.json", "--trace"),
    _c(TRAIN + "--eval-every 0", "--eval-every"),
    _c(TRAIN + "--eval-every -1", "--eval-every"),
    _c(TRAIN + "--eval-every 1", "--eval-data"),
    _c(TRAIN + "--eval-every 1 --eval-data {tmp}/none.txt", "not found"),
    _c(TRAIN + "--eval-every 1 --eval-data {dir}", "manifest"),
    _c(["train", "--eval-every", "1", "--eval-data", ""], "--eval-data"),
    _c(TRAIN + "--eval-tokens 0", "--eval-tokens"),
    _c(TRAIN + f"--eval-tokens {BIG}", "--eval-tokens"),
    _c(TRAIN + "--eval-every 1 --eval-data synthetic --eval-tokens 100000000000", "--eval-tokens"),
    _c(TRAIN + "--eval-every 1 --eval-data {prep_val_short}", "shorter"),
    _c(TRAIN + "--rank-layout xyz", "--rank-layout"),
    _c(SIM + "--rank-layout xyz", "--rank-layout"),
    _c(SIM + "--rank-layout", "--rank-layout"),
    _c(TRAIN + "--pipeline xyz", "--pipeline"),
    _c(SIM + "--pipeline zb-x", "--pipeline"),
    _c(SIM + "--pp 2 --pipeline zb-v --layer-split 2,2", "layer"),
    _c(SIM + "--pp 2 --pipeline zb-v --layer-split 1,1,1,0", "layer"),
    _c(SIM + "--pp 2 --pipeline zb-v --layer-split 1,1,1,2", "layer"),
    _c(SIM + "--pp 2 --pipeline 1f1b-v --layer-split 1,1,1", "layer"),
    _c(SIM + "--pp 2 --pipeline 1f1b-v --layer-split 1,1,1,-1", "layer"),
    _c(SIM + "--pp 4 --pipeline zb-v", "chunks"),
    _c(TRAIN + "--pp 2 --pipeline zb-v --layer-split 2,2", "layer"),
    _c(TRAIN + "--pp 2 --pipeline 1f1b-v --layer-split 1,1,1,0", "layer"),
    # -- plan files -------------------------------------------------------------------------
    _c(SIM + "--plan {plan_noplan}", "'plan'"),
    _c(SIM + "--plan {plan_list}", "'plan'"),
    _c(SIM + "--plan {plan_empty}", "'plan'"),
    _c(SIM + "--plan {plan_extra}", "unknown field"),
    _c(SIM + "--plan {plan_pp_str}", "pp"),
    _c(SIM + "--plan {plan_pp_float}", "pp"),
    _c(SIM + "--plan {plan_pp_bool}", "pp"),
    _c(SIM + "--plan {plan_pp_null}", "pp"),
    _c(SIM + "--plan {plan_dp_neg}", "dp"),
    _c(SIM + "--plan {plan_split_str}", "layer_split"),
    _c(SIM + "--plan {plan_split_nested}", "layer_split"),
    _c(SIM + "--plan {plan_recompute_int}", "recompute"),
    _c(SIM + "--plan {plan_recompute_dict}", "recompute"),
    _c(SIM + "--plan {plan_dtype_int}", "compute_dtype"),
    _c(SIM + "--plan {plan_pipeline_list}", "pipeline"),
    _c(SIM + "--plan {plan_bool_str}", "shard_optimizer"),
    _c(SIM + "--plan {plan_clip_str}", "clip_grad"),
    _c(SIM + "--plan {plan_clip_nan}", "clip_grad"),
    _c(SIM + "--plan {plan_bucket_float}", "bucket"),
    _c(SIM + "--plan {plan_model_int}", "model"),
    _c(SIM + "--plan {plan_cap_str}", "memory_cap_gib"),
    _c(SIM + "--plan {plan_cap_neg}", "memory_cap_gib"),
    _c(SIM + "--plan {plan_platform_int}", "platform"),
    _c(SIM + "--plan {plan_platform_missing}", "not found"),
    _c(SIM + "--plan {plan_garbage}", "YAML"),
    _c(SIM + "--plan {plan_binary}", "plan file"),
    _c(TRAIN + "--plan {plan_extra}", "unknown field"),
    _c(TRAIN + "--plan {plan_pp_str}", "pp"),
    _c(TRAIN + "--plan {plan_split_str}", "layer_split"),
    _c(EVAL + "--data synthetic --plan {tmp}/none.yaml", "not found", needs=("ckpt",)),
    # -- platform files ---------------------------------------------------------------------
    _c(SIM + "--platform {platform_missing}", "missing field"),
    _c(SIM + "--platform {platform_extra}", "unknown"),
    _c(SIM + "--platform {platform_wrongtype}", "must be a number"),
    _c(SIM + "--platform {platform_inf}", "usable_memory_bytes"),
    _c(SIM + "--platform {platform_nan}", "usable_memory_bytes"),
    _c(SIM + "--platform {platform_bool}", "must be a number"),
    _c(SIM + "--platform {platform_nonote}", "provenance"),
    _c(SIM + "--platform {platform_section}", "must be a mapping"),
    _c(SIM + "--platform {platform_list}", "platform"),
    _c(SIM + "--platform {platform_garbage}", "platform"),
    _c(SIM + "--platform {platform_binary}", "platform"),
    _c(SIM + "--platform {platform_name_int}", "name must be"),
    _c(SIM + "--platform {platform_efficiency}", "efficiency"),
    _c(SIM + "--platform {dir}", "platform"),
    _c(PLAN.replace("mt3000", "{platform_extra}"), "unknown"),
    # -- token files that do not match their manifest, tokenizers ---------------------------
    _c(TRAIN + "--data {prep_short}", "shorter"),
    _c(TRAIN + "--data {prep_long}", "longer"),
    _c(TRAIN + "--data {prep_odd}", "whole number"),
    _c(TRAIN + "--data {prep_empty_file}", "shorter"),
    _c(TRAIN + "--data {prep_no_file}", "not found"),
    _c(TRAIN + "--data {prep_tokens_str}", "manifest"),
    _c(TRAIN + "--data {prep_tokens_neg}", "manifest"),
    _c(TRAIN + "--data {prep_no_manifest}", "manifest"),
    _c(TRAIN + "--data {prep_manifest_garbage}", "manifest"),
    _c(TRAIN + "--data {prep_manifest_list}", "manifest"),
    _c(TRAIN + "--data {prep_file_escape}", "manifest"),
    _c(TRAIN + "--data {prep} --data-dtype uint32", "--data-dtype"),
    _c(TRAIN + "--data {prep} --tokenizer {tok_empty}", "tokenizer"),
    _c(TRAIN + "--data {text} --tokenizer {tok_empty}", "tokenizer"),
    _c(TRAIN + "--data {text} --tokenizer {tok_garbage}", "cannot read tokenizer"),
    _c(TRAIN + "--data {text} --tokenizer {tok_binary}", "cannot read tokenizer"),
    _c(TRAIN + "--data {text} --tokenizer {tok_isdir}", "tokenizer"),
    _c(TRAIN + "--data {text} --tokenizer {tok_big}", "vocab"),
    _c(EVAL + "--data {text} --tokenizer {tok_big}", "vocab", needs=("ckpt",)),
    _c(TRAIN + "--data {odd_bin}", "whole number"),
    _c(TRAIN + "--data {empty_bin}", "empty"),
    # -- numeric ranges of the other commands ---------------------------------------------
    _c(TRAIN + f"--seed {BIG}", "--seed"),
    _c(TRAIN + "--seed 18446744073709551615", "--seed"),
    _c(TRAIN + "--malloc-mmap-threshold -1", "--malloc-mmap-threshold"),
    _c(TRAIN + f"--malloc-mmap-threshold {BIG}", "--malloc-mmap-threshold"),
    _c(TRAIN + "--malloc-mmap-threshold abc", "--malloc-mmap-threshold"),
    _c(TRAIN + "--timeout -1", "--timeout"),
    _c(TRAIN + "--lr 1e400", "--lr"),
    _c(TRAIN + "--weight-decay inf", "--weight-decay"),
    _c(TRAIN + "--clip-grad -1", "--clip-grad"),
    _c(TRAIN + "--save-every -1", "--save-every"),
    _c(TRAIN + "--keep 0", "--keep"),
    _c(SIM + "--seq -5", "--seq"),
    _c(SIM + "--view-lookahead 1.5", "--view-lookahead"),
    _c(SIM + "--headroom 0.95", "--headroom"),
    _c(SIM + "--headroom nan", "--headroom"),
    _c(PLAN + "--headroom -0.1", "--headroom"),
    _c(PLAN + "--trial 0", "--trial"),
    _c(PLAN + "--trial-steps 0", "--trial-steps"),
    _c(PLAN + "--trial-time-limit nan", "--trial-time-limit"),
    _c(TRAIN + "--device tpu", "--device"),
    _c(TRAIN + "--peer-timeout 0", "--peer-timeout"),
    _c(TRAIN + "--peer-timeout 1e300", "--peer-timeout"),
    _c(["train", "--wandb", ""], "--wandb"),
    _c("verify --quiet --pipeline xyz", "--pipeline"),
    _c("verify --quiet --rank-layout xyz", "--rank-layout"),
    _c(BCL + "--trial -1", "--trial"),
    _c(BCL + "--trial-steps 0", "--trial-steps"),
    _c(SIM + f"--sync-bucket-bytes {BIG}", "--sync-bucket-bytes"),
    _c(SIM + f"--loss-chunk-tokens {BIG}", "--loss-chunk-tokens"),
    _c(PLAN + "--time-budget -1", "--time-budget"),
    _c(PLAN + "--time-budget inf", "--time-budget"),
    _c(PLAN + "--top -1", "--top"),
    _c("verify --quiet --seed 18446744073709551615", "--seed"),
    _c("verify --quiet --tolerance -1", "--tolerance"),
    _c("calibrate --no-progress -o {tmp}/c.yaml --max-spread -1", "--max-spread"),
    _c("calibrate --no-progress -o {tmp}/c.yaml --budget-s 1e300", "--budget-s"),
    _c("export {dir} --hf {tmp}/hf --max-shard-gb 0", "--max-shard-gb"),
    _c("bench paper --quiet --clusters 0", "--clusters"),
    # -- abbreviations: a flag is named in full -------------------------------------------
    _c(TRAIN + "--glob 8", "--glob"),
    _c(SIM + "--micro 2", "--micro"),
    _c(PLAN + "--cl 4", "--cl"),
    _c("eval {tmp}/c --dat synthetic", "--dat"),
]


# -- fixtures ---------------------------------------------------------------------------------
def _write(p: Path, text: str | bytes) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text)
    return p


def _tokenizer(d: Path, n_words: int = 40) -> Path:
    """A word-level tokenizer of `n_words` words, "hello" and an end-of-text token (no
    download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<|endoftext|>", "[UNK]"] + [f"w{i}" for i in range(n_words)] + ["hello"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    d.mkdir(parents=True, exist_ok=True)
    tok.save(str(d / "tokenizer.json"))
    return d


def _prepared(root: Path, txt: Path, tok: Path) -> dict[str, Path]:
    """A prepared folder and copies of it whose token files or manifest are damaged."""
    from ratrain.data.prepare import PrepareRequest, prepare

    prep = root / "prep"
    prepare(PrepareRequest((txt,), tok, prep, txt_docs="paragraph", val_fraction=0.2, workers=1))
    m = json.loads((prep / "manifest.json").read_text())
    train_file = m["splits"]["train"]["file"]
    out = {"prep": prep}

    def variant(name: str, edit) -> None:
        d = root / name
        shutil.copytree(prep, d)
        edit(d, copy.deepcopy(m))
        out[name] = d

    def tokens(d: Path, fn) -> None:
        f = d / train_file
        f.write_bytes(fn(f.read_bytes()))

    def manifest(d: Path, mm: dict, fn) -> None:
        fn(mm)
        (d / "manifest.json").write_text(json.dumps(mm))

    variant("prep_short", lambda d, mm: tokens(d, lambda b: b[: len(b) // 2]))
    val_file = m["splits"]["val"]["file"]
    variant("prep_val_short", lambda d, mm: (d / val_file).write_bytes(b"\x01\x00" * 3))
    variant("prep_long", lambda d, mm: tokens(d, lambda b: b + b[:64]))
    variant("prep_odd", lambda d, mm: tokens(d, lambda b: b + b"\x01"))
    variant("prep_empty_file", lambda d, mm: tokens(d, lambda b: b""))
    variant("prep_no_file", lambda d, mm: (d / train_file).unlink())
    variant(
        "prep_tokens_str",
        lambda d, mm: manifest(d, mm, lambda x: x["splits"]["train"].update(tokens="many")),
    )
    variant(
        "prep_tokens_neg",
        lambda d, mm: manifest(d, mm, lambda x: x["splits"]["train"].update(tokens=-5)),
    )
    variant(
        "prep_file_escape",
        lambda d, mm: manifest(d, mm, lambda x: x["splits"]["train"].update(file="../a-file")),
    )
    variant("prep_no_manifest", lambda d, mm: (d / "manifest.json").unlink())
    variant("prep_manifest_garbage", lambda d, mm: _write(d / "manifest.json", "{not json"))
    variant("prep_manifest_list", lambda d, mm: _write(d / "manifest.json", "[1, 2]"))
    return out


_PLAN_EDITS = {
    "plan_extra": {"colour": "blue"},
    "plan_pp_str": {"pp": "two"},
    "plan_pp_float": {"pp": 1.5},
    "plan_pp_bool": {"pp": True},
    "plan_pp_null": {"pp": None},
    "plan_dp_neg": {"dp": -2},
    "plan_split_str": {"layer_split": "a,b"},
    "plan_split_nested": {"layer_split": [[2], [2]]},
    "plan_recompute_int": {"recompute": 5},
    "plan_recompute_dict": {"recompute": {"a": 1}},
    "plan_dtype_int": {"compute_dtype": 16},
    "plan_pipeline_list": {"pipeline": ["1f1b"]},
    "plan_bool_str": {"shard_optimizer": "maybe"},
    "plan_clip_str": {"clip_grad": "abc"},
    "plan_clip_nan": {"clip_grad": float("nan")},
    "plan_bucket_float": {"bucket_bytes": 1.5},
    "plan_model_int": {"model": 7},
}


def _plans(root: Path) -> dict[str, Path]:
    base = {
        "plan": {"pp": 1, "dp": 1, "micro_batch": 2, "global_batch": 4, "seq": 32},
        "model": "tiny",
    }
    out = {}
    for name, edit in _PLAN_EDITS.items():
        d = copy.deepcopy(base)
        d["plan"].update(edit)
        out[name] = _write(root / f"{name}.json", json.dumps(d))
    extras = {
        "plan_cap_str": {"memory_cap_gib": "lots"},
        "plan_cap_neg": {"memory_cap_gib": -1},
        "plan_platform_int": {"platform": 5},
        "plan_platform_missing": {"platform": str(root / "none.yaml")},
    }
    for name, edit in extras.items():
        out[name] = _write(root / f"{name}.json", json.dumps({**base, **edit}))
    out["plan_noplan"] = _write(root / "plan_noplan.yaml", "model: tiny\n")
    out["plan_list"] = _write(root / "plan_list.yaml", "- pp: 1\n")
    out["plan_empty"] = _write(root / "plan_empty.yaml", "")
    out["plan_garbage"] = _write(root / "plan_garbage.yaml", "plan: {pp: [1\n")
    out["plan_binary"] = _write(root / "plan_binary.yaml", bytes(range(256)))
    return out


def _platforms(root: Path) -> dict[str, Path]:
    import yaml

    from ratrain.platforms.load import PRESETS_DIR

    base = yaml.safe_load((PRESETS_DIR / "cpu-local.yaml").read_text())

    def variant(name: str, edit) -> None:
        d = copy.deepcopy(base)
        edit(d)
        out[name] = _write(root / f"{name}.yaml", yaml.safe_dump(d))

    out: dict[str, Path] = {}
    variant("platform_missing", lambda d: d.pop("workspace_bytes"))
    variant("platform_extra", lambda d: d.update(colour="blue"))
    variant("platform_wrongtype", lambda d: d["usable_memory_bytes"].update(value="lots"))
    variant("platform_inf", lambda d: d["usable_memory_bytes"].update(value=float("inf")))
    variant("platform_nan", lambda d: d["usable_memory_bytes"].update(value=float("nan")))
    variant("platform_bool", lambda d: d["workspace_bytes"].update(value=True))
    variant("platform_nonote", lambda d: d["workspace_bytes"].pop("note"))
    variant("platform_section", lambda d: d.update(compute=[1, 2]))
    variant("platform_name_int", lambda d: d.update(name=5))
    variant("platform_efficiency", lambda d: d["compute"]["efficiency"].update(value=1.5))
    out["platform_list"] = _write(root / "platform_list.yaml", "- 1\n- 2\n")
    out["platform_garbage"] = _write(root / "platform_garbage.yaml", "name: [x\n")
    out["platform_binary"] = _write(root / "platform_binary.yaml", bytes(range(256)))
    return out


def _job_files(root: Path) -> dict[str, Path]:
    jobs = {
        "job_garbage": "plan: {pp: [1\n",
        "job_list": "- 1\n- 2\n",
        "job_section": "colours:\n  pp: 2\n",
        "job_key": "plan:\n  ppp: 2\n",
        "job_misplaced": "training:\n  pp: 2\n",
        "job_pp0": "plan:\n  pp: 0\n",
        "job_ppstr": "plan:\n  pp: two\n",
        "job_ppbool": "plan:\n  pp: true\n",
        "job_lrlist": "training:\n  lr: [1, 2]\n",
        "job_quiet": "output:\n  quiet: 3\n",
        "job_keys_list": "plan:\n  - pp\n",
    }
    out = {k: _write(root / f"{k}.yaml", v) for k, v in jobs.items()}
    out["job_toml"] = _write(root / "job_toml.toml", "[plan\npp = 2\n")
    return out


def _checkpoint(root: Path) -> Path:
    """A checkpoint of the tiny model after one step (the reference trainer would not
    save one: this is the distributed runtime on one rank, about 15 s)."""
    from ratrain.cli import main as cli

    save = root / "ckpt"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        rc = cli(["train", "--pp", "1", "--steps", "1", "--quiet", "--save", str(save)])
    assert rc == 0, "training the checkpoint fixture failed"
    return save


def make_fixtures(root: Path, *, checkpoint: bool = True) -> dict[str, str]:
    """The files the cases name, under `root`: {name: path}."""
    root.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {
        "file": _write(root / "a-file", "not a folder, not a plan\n"),
        "dir": root / "a-dir",
        "tmp": root / "tmp",
        "out_png": _write(root / "out" / "keep.png", b"\x89PNG kept\n"),
        "out_yaml": _write(root / "out" / "keep.yaml", "kept: true\n"),
        "metrics": _write(root / "m.jsonl", '{"step": 1, "loss": 5.0}\n{"step": 2, "loss": 4.0}\n'),
        "txt": _write(root / "corpus.txt", "\n\n".join(f"w{i % 40} " * 30 for i in range(60))),
        "text": _write(root / "text.txt", " ".join(f"w{i % 40}" for i in range(2000))),
        "tok_empty": root / "tok_empty",
        "tok_garbage": _write(root / "tok_garbage" / "tokenizer.json", "{not json"),
        "tok_binary": _write(root / "tok_binary" / "tokenizer.json", bytes(range(256)) * 4),
        "tok_isdir": root / "tok_isdir",
        "odd_bin": _write(root / "odd.bin", b"\x01\x00\x02"),
        "empty_bin": _write(root / "empty.bin", b""),
    }
    for d in ("dir", "tmp", "tok_empty"):
        paths[d].mkdir(exist_ok=True)
    (root / "tok_isdir" / "tokenizer.json").mkdir(parents=True, exist_ok=True)
    paths["tok_garbage"] = paths["tok_garbage"].parent
    paths["tok_binary"] = paths["tok_binary"].parent
    paths["tok"] = _tokenizer(root / "tok")
    paths["tok_big"] = _tokenizer(root / "tok_big", 1000)  # more ids than tiny's 256
    paths |= _prepared(root, paths["txt"], paths["tok"])
    paths |= _plans(root)
    paths |= _platforms(root)
    paths |= _job_files(root)
    if checkpoint:
        paths["ckpt"] = _checkpoint(root)
    return {k: str(v) for k, v in paths.items()}


# -- running a case ---------------------------------------------------------------------------
class StartedWork(AssertionError):
    """A bad value reached real work."""


def _work_points():
    """(owner, attribute) of every entry point of real work a command reaches."""
    import ratrain.bench.cluster as bench_cluster
    import ratrain.bench.link_probe as link_probe
    import ratrain.bench.whatif as whatif
    import ratrain.calibrate as cal
    import ratrain.data.prepare as data_prepare
    import ratrain.launch.emulate as emulate
    import ratrain.nn.generate as nn_generate
    import ratrain.observe.curves as curves
    import ratrain.planner as planner
    import ratrain.planner.paper as paper
    import ratrain.sim as sim
    import ratrain.train.failures as failures
    import ratrain.train.job as job
    import ratrain.train.reference as reference

    return [
        (job, "spawn"),
        (reference.ReferenceTrainer, "train"),
        (sim, "simulate"),
        (planner, "search"),
        (paper, "compare_models"),
        (cal, "_measure_windows"),
        (failures, "run_job"),
        (data_prepare, "_encode_all"),
        (emulate.EmulatedNetwork, "__enter__"),
        (link_probe, "_probe"),
        (curves, "plot_curves"),
        (bench_cluster, "run_bench"),
        (bench_cluster, "calibrate_base"),
        (whatif, "whatif_grid"),
        (nn_generate, "generate"),
    ]


@contextlib.contextmanager
def guard_work():
    """Every entry point of real work raises `StartedWork` while inside."""

    def work(*a, **k):
        raise StartedWork("a bad value started real work")

    saved = [(o, n, o.__dict__[n]) for o, n in _work_points()]
    try:
        for o, n, _ in saved:
            setattr(o, n, work)
        yield
    finally:
        for o, n, v in saved:
            setattr(o, n, v)


def snapshot(root: str) -> dict[str, tuple[int, int]]:
    """{path: (size, mtime_ns)} of every file and folder under `root`."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            out[p] = (st.st_size if n in files else 0, st.st_mtime_ns if n in files else 0)
    return out


@dataclass
class Result:
    case: Case
    argv: list[str]
    rc: int | str
    err: str
    changed: list[str]
    """Files or folders that existed and were changed or removed, or were created."""

    @property
    def lines(self) -> list[str]:
        return [x for x in self.err.splitlines() if x.strip()]

    def problems(self) -> list[str]:
        from ratrain.cli import ALIASES

        out = []
        if self.rc != 2:
            out.append(f"exit {self.rc}")
        if len(self.lines) != 1:
            out.append(f"{len(self.lines)} lines")
        if "Traceback" in self.err or isinstance(self.rc, str):
            out.append("traceback")
        names = (f"ratrain {self.argv[0]}", f"ratrain {ALIASES.get(self.argv[0], self.argv[0])}")
        if self.lines and not self.lines[0].startswith(names):
            out.append("not 'ratrain COMMAND...'")
        if self.case.needle not in self.err:
            out.append(f"no {self.case.needle!r}")
        if self.changed:
            out.append(f"changed or created {', '.join(self.changed[:3])}")
        return out


def run_case(case: Case, paths: dict[str, str], root: str) -> Result:
    """`ratrain ARGV` in-process, guarded, from the working directory `root`/tmp (a command
    that would write a default output writes it there)."""
    from ratrain.cli import main as cli

    argv = [a.format(**paths) for a in case.argv]
    before = snapshot(root)
    err, here = io.StringIO(), os.getcwd()
    os.chdir(paths["tmp"])
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            with guard_work(), warnings.catch_warnings():
                warnings.simplefilter("default")  # each case as a fresh process shows them
                try:
                    rc: int | str = cli(argv)
                except SystemExit as e:  # main turns usage errors into a code; never reached
                    rc = e.code if isinstance(e.code, int) else 2
                except BaseException as e:  # noqa: BLE001 - the audit reports it
                    rc = type(e).__name__
                    err.write(traceback.format_exc())
    finally:
        os.chdir(here)
    after = snapshot(root)
    changed = sorted(
        os.path.relpath(p, root) for p in set(before) | set(after) if before.get(p) != after.get(p)
    )
    shutil.rmtree(paths["tmp"])
    os.mkdir(paths["tmp"])
    return Result(case, argv, rc, err.getvalue(), changed)


def _cell(text: str, root: str) -> str:
    return text.replace(root, "…").replace("|", "\\|").replace("\n", " ")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    fast = "--fast" in args
    root = tempfile.mkdtemp(prefix="bad-input-")
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            paths = make_fixtures(Path(root), checkpoint=not fast)
        cases = [c for c in CASES if not (fast and c.needs)]
        results = [run_case(c, paths, root) for c in cases]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("| case | exit code | first line printed |")
    print("|---|---|---|")
    bad = []
    for r in results:
        first = r.lines[0] if r.lines else "(nothing)"
        mark = ""
        if r.problems():
            bad.append(r)
            mark = " **[" + "; ".join(r.problems()) + "]**"
        print(f"| `{_cell(' '.join(r.argv), root)}` | {r.rc} | {_cell(first, root)}{mark} |")
    print(f"\n{len(results)} cases, {len(bad)} breaking a rule")
    for r in bad:
        print(f"- `{_cell(' '.join(r.argv), root)}`: {'; '.join(r.problems())}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
