"""The C++ toolchain that CPU inductor (`--compile`) uses."""

from __future__ import annotations

import os
import shutil

__all__ = ["cxx_compiler"]


def cxx_compiler() -> str | None:
    """The C++ compiler CPU inductor would use ($CXX, else c++/g++/clang++), or None."""
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return name
    return None
