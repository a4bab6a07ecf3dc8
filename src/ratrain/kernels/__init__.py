"""Execution backends: the GEMM and attention kernels the model calls.

A backend is chosen by name (`get_backend("torch")`, `get_backend("tiled")`). The model
calls only the methods of `Backend`; backward passes go through autograd (a backend with
its own backward wraps it in a `torch.autograd.Function`).
"""

from __future__ import annotations

from ratrain.kernels.base import Backend, register_backend
from ratrain.kernels.registry import available_backends, get_backend

__all__ = ["Backend", "get_backend", "register_backend", "available_backends"]
