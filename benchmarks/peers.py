"""The peer systems now live in the package (`ratrain.bench.peers`); this name stays for
the benchmark scripts that import `peers`."""

from ratrain.bench.peers import *  # noqa: F401,F403
from ratrain.bench.peers import __all__  # noqa: F401
