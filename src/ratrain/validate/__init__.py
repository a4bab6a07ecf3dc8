"""Validation: a grid of plans run for real beside the simulator's predictions, with statistics, rescoring and plots."""
