"""Validation (`ratrain validate`): plans run for real beside the simulator's predictions.

A platform file (`ratrain calibrate`'s, or a preset) predicts every plan's step time and
peak memory; validation runs a grid of plans through the runtime and says how far the
predictions were from what it measured, and whether `ratrain plan`'s pick is the measured
fastest. The modules:

- `grid`: the plans to run and the model each one trains (the default grid, grid files);
- `run`: runs them through the runtime (`run_job`, as `ratrain train` does), timing each
  plan over alternating passes and measuring its peak memory (needs torch);
- `results`: each plan's prediction beside its measurement, the summary over them and
  the planner's check;
- `stats`: the statistics (MAPE, largest error, Kendall's τ, the pick's shortfall);
- `speed`: the machine's speed during validation against calibration, from the speed
  probe's times (`ratrain.calibrate.probe` times it);
- `rescore`: an earlier run's measurements predicted again on another platform file,
  running nothing;
- `breakdown`: measured vs simulated time per kind of action, for finding which term of
  the cost model is off;
- `plot`: the predicted-vs-measured scatter and one plan's two timelines (matplotlib).

Everything but `run` imports no torch, so re-scoring runs where torch is not installed.
"""
