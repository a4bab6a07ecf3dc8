"""benchmarks/bad_input_audit.py as a module: its cases, and its one list of the entry
points of real work (`guard_work`) that every bad-input test guards."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

AUDIT_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "bad_input_audit.py"


def load_audit():
    name = "bad_input_audit"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, AUDIT_PATH)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while it loads
        spec.loader.exec_module(module)
    return sys.modules[name]
