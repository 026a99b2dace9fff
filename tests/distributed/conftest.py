import os

import pytest


@pytest.fixture(scope="package")
def ray_local_cluster():
    """A private Ray cluster on loopback for tests/distributed (the same start path the commands use); stopped
    when the folder's tests end, not left idle through the rest of the session."""
    from shop_r1.config import RayConfig
    from shop_r1.distributed.runtime import start_ray

    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    runtime = start_ray(RayConfig(num_cpus=4))
    yield runtime
    runtime.shutdown()
