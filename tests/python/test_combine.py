"""deca.combine against the numpy reference."""

import numpy as np
import pytest

import deca
import numpy_reference as ref
from cases import close, close_lse


def _partials(rng, splits, batch, q_len, heads, dv):
    po = rng.standard_normal((splits, batch, q_len, heads, dv)).astype(np.float32)
    pl = rng.normal(0.0, 3.0, (splits, batch, q_len, heads)).astype(np.float32)
    pl[rng.random(pl.shape) < 0.25] = -np.inf  # splits that saw no key
    po[np.isneginf(pl)] = np.nan  # ... whose partial output must be ignored
    pl[:, 0, 0, 0] = -np.inf  # a row with no key at all
    return po, pl


@pytest.mark.parametrize("out_dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("with_sink", [False, True])
def test_combine_matches_numpy(rng, out_dtype, with_sink):
    po, pl = _partials(rng, 4, 2, 2, 8, 64)
    sink = rng.normal(0.0, 2.0, 8).astype(np.float32) if with_sink else None
    out, lse = deca.combine(po, pl, attn_sink=sink, out_dtype=out_dtype, return_lse=True)
    want, want_lse = ref.combine(po, pl, sink)
    close(out, want, out_dtype)
    close_lse(lse, want_lse)
    assert (np.asarray(out[0, 0, 0]).astype(np.float32) == 0).all()


def test_combine_one_split_is_identity(rng):
    po = rng.standard_normal((1, 2, 1, 4, 32)).astype(np.float32)
    pl = rng.normal(0.0, 1.0, (1, 2, 1, 4)).astype(np.float32)
    out, lse = deca.combine(po, pl, return_lse=True)
    np.testing.assert_allclose(out, po[0], rtol=1e-6)
    np.testing.assert_allclose(lse, pl[0], rtol=1e-6)
