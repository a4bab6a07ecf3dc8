"""A synthetic earlier `ratrain validate` run (its JSON), for the tests of `--rescore` and
of the commands that need no torch."""

from __future__ import annotations

import json

from ratrain.config import Plan

TINY = dict(n_layers=2, hidden=64, n_heads=4, n_kv_heads=4, ffn=172, vocab=256)


JOB = dict(global_batch=4, seq=32, compute_dtype="fp32")


PLANS = {
    "a": dict(micro_batch=2),
    "b": dict(pp=2, micro_batch=1),
    "c": dict(dp=2, micro_batch=1),
}


MEASURED_S = {"a": 0.010, "b": 0.020, "c": 0.015}


def previous_run(tmp_path, *, models=True, **overrides):
    results = []
    for name, fields in PLANS.items():
        plan = Plan(**JOB, **fields)
        results.append(
            {
                "name": name,
                "model": "tiny",
                "plan": plan.to_dict(),
                "predicted_step_s": 1.0,  # the old platform's: ignored
                "measured_step_s": MEASURED_S[name],
                "ledger_peak_bytes": [1] * plan.pp,
                "measured_peak_bytes": [[1_000_000] * plan.dp for _ in range(plan.pp)],
            }
        )
    doc = {"platform": "old", "summary": {"mape": 0.5, "max_error": 0.9}, "results": results}
    if models:
        doc["models"] = {"tiny": TINY}
    doc.update(overrides)
    path = tmp_path / "prev.json"
    path.write_text(json.dumps(doc))
    return path
