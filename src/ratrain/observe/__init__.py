"""Observation: metrics, traces, step profiles and measured memory."""
