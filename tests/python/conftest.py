import os
import sys
import types

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


class _NoModules(types.ModuleType):
    """sys without sys.modules."""

    def __getattr__(self, name):
        if name == "modules":
            raise AssertionError("deca read sys.modules (torch.compile's tracer enumerates the "
                                 "whole dict for that, and fails if an import changes it)")
        return getattr(sys, name)


@pytest.fixture
def sys_modules_off_limits(monkeypatch):
    """deca's modules see a sys without .modules for the test. Traced code that looks a module up
    in sys.modules makes torch.compile's tracer walk the whole dict, which fails when one of the
    tracer's own lazy imports lands mid-walk: an import-order accident no test provokes at will,
    so the tests that compile deca's wrappers assert instead that deca never looks there."""
    stand_in = _NoModules("sys")
    for name, module in list(sys.modules.items()):
        if name == "deca" or name.startswith("deca."):
            for attr, value in list(vars(module).items()):
                if value is sys:
                    monkeypatch.setattr(module, attr, stand_in)
