import os

import numpy as np
import pytest


@pytest.fixture
def rng(request):
    """A generator seeded from DECA_TEST_SEED (default 1234) and the test's name, so a failure
    replays with the same data."""
    base = int(os.environ.get("DECA_TEST_SEED", "1234"))
    digest = sum(ord(c) * (i + 1) for i, c in enumerate(request.node.nodeid))
    return np.random.default_rng([base, digest])
