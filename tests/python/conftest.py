import os

import numpy as np
import pytest

# The jax tests are about DLPack dtype codes on the CPU. On a GPU machine jax would otherwise
# put arrays on the GPU and reserve most of its memory, starving the torch CUDA tests.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
# Checked mode on by default in the tests (issue 9), as in the C++ suites; set before deca loads.
os.environ.setdefault("DECA_CHECKED", "1")


@pytest.fixture
def rng(request):
    """A generator seeded from DECA_TEST_SEED (default 1234) and the test's name, so a failure
    replays with the same data."""
    base = int(os.environ.get("DECA_TEST_SEED", "1234"))
    digest = sum(ord(c) * (i + 1) for i, c in enumerate(request.node.nodeid))
    return np.random.default_rng([base, digest])
