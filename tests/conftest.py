import os

import pytest

# Keep torch from oversubscribing the 2-core CI machine when several ranks run at once.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True)
def _teardown_process_groups():
    yield
    try:
        import torch.distributed as dist
    except ImportError:
        return
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
