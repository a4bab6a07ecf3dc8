"""Backends by name: the built-in ones are imported on the first request, so importing
`ratrain.kernels` costs nothing until a backend is asked for; each registers itself in
`base.REGISTRY` as it is imported."""

from __future__ import annotations

from ratrain.errors import RatrainError
from ratrain.kernels.base import REGISTRY, Backend

__all__ = ["available_backends", "get_backend"]


def _load_builtin() -> None:
    import ratrain.kernels.torch_backend  # noqa: F401

    try:
        import ratrain.kernels.tiled  # noqa: F401
    except ImportError:
        pass


def available_backends() -> list[str]:
    _load_builtin()
    return sorted(REGISTRY)


def get_backend(name: str | Backend = "torch") -> Backend:
    if not isinstance(name, str):
        return name
    _load_builtin()
    if name not in REGISTRY:
        raise RatrainError(f"unknown backend {name!r}; choose one of {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name]()
