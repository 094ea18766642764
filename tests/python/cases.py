"""Random paged-cache cases for the Python tests: stored tensors for deca, float64 for numpy."""

import math

import numpy as np

import numpy_reference as ref

F8_MAX = 448.0


def store(values, dtype, scale=1.0):
    """Real values -> (stored array as deca takes it, float64 of the stored numbers)."""
    if dtype == "bf16":
        s = values.astype(ref.BF16)
    elif dtype == "fp16":
        s = values.astype(np.float16)
    elif dtype == "fp8_e4m3":
        s = (values / scale).astype(ref.FP8)
    elif dtype == "int8":
        s = np.clip(np.rint(values / scale), -127, 127).astype(np.int8)
    else:
        raise ValueError(dtype)
    return s, s.astype(np.float64)


def poison_value(dtype):
    """A value that spreads if read: NaN where the format has one."""
    return {"bf16": np.nan, "fp16": np.nan, "fp8_e4m3": np.nan, "int8": 127}[dtype]


class PagedCase:
    """A batch of requests over a shuffled page pool. Slots no request owns, and one extra page
    that every unused page-table column points at, are poisoned."""

    def __init__(self, rng, *, seq_lens, q_len=1, hq=8, hkv=2, d=64, page=16, layout="NHD",
                 q_dtype="bf16", kv_dtype="bf16", k_scale=1.0, v_scale=1.0, per_head=False,
                 shared_kv=False):
        self.seq_lens = np.asarray(seq_lens, np.int32)
        self.k_scale, self.v_scale = k_scale, v_scale
        batch = len(seq_lens)
        self.layout = layout
        need = [math.ceil(n / page) for n in seq_lens]
        max_pages = max(need) + 1
        num_pages = sum(need) + 2
        ids = rng.permutation(num_pages)
        poison_page = int(ids[-1])
        self.page_table = np.full((batch, max_pages), poison_page, np.int32)
        owned = np.zeros((num_pages, page), bool)
        at = 0
        for b, n in enumerate(seq_lens):
            for j in range(need[b]):
                pg = int(ids[at])
                at += 1
                self.page_table[b, j] = pg
                owned[pg, :min(page, n - j * page)] = True

        shape = ((num_pages, page, hkv, d) if layout == "NHD" else (num_pages, hkv, page, d))
        if per_head:
            self.k_scales = rng.uniform(0.5, 2.0, hkv).astype(np.float32) * k_scale
            self.v_scales = rng.uniform(0.5, 2.0, hkv).astype(np.float32) * v_scale
            ks = self.k_scales[None, None, :, None] if layout == "NHD" else \
                self.k_scales[None, :, None, None]
            vs = self.v_scales[None, None, :, None] if layout == "NHD" else \
                self.v_scales[None, :, None, None]
        else:
            self.k_scales = self.v_scales = None
            ks, vs = k_scale, v_scale
        k_real = rng.standard_normal(shape)
        v_real = rng.standard_normal(shape)
        self.k, k64 = store(k_real, kv_dtype, ks)
        self.v, v64 = store(v_real, kv_dtype, vs)
        if shared_kv:
            # K and V as two views of one allocation: [num_pages, 2, ...] -> strided views.
            both = np.empty((num_pages, 2) + shape[1:], self.k.dtype)
            both[:, 0], both[:, 1] = self.k, self.v
            self.k, self.v = both[:, 0], both[:, 1]
        for pg, slot in zip(*np.nonzero(~owned)):
            idx = (pg, slot) if layout == "NHD" else (pg, slice(None), slot)
            self.k[idx] = poison_value(kv_dtype)
            self.v[idx] = poison_value(kv_dtype)
        # The reference reads unscaled stored numbers and applies the scales itself.
        self.k64, self.v64 = k64, v64
        self.q, self.q64 = store(rng.standard_normal((batch, q_len, hq, d)), q_dtype)

    def reference(self, **kw):
        if self.k_scales is None:
            ks = dict(k_scale=self.k_scale, v_scale=self.v_scale)
        else:
            ks = dict(k_scales=self.k_scales, v_scales=self.v_scales)
        return ref.gqa_decode(self.q64, self.k64, self.v64, self.page_table, self.seq_lens,
                              layout=self.layout, **ks, **kw)


def csr_pages(case, page):
    """FlashInfer's CSR form of a case's page table at `page` tokens a page: (indptr, indices,
    last_page_len)."""
    counts = [-(-int(n) // page) for n in case.seq_lens]
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    indices = np.concatenate([case.page_table[b, :c] for b, c in enumerate(counts)] +
                             [np.zeros(0, np.int32)]).astype(np.int32)
    last = np.array([(n - 1) % page + 1 if n else 0 for n in case.seq_lens], np.int32)
    return indptr, indices, last


def to_cuda(a, device="cuda:0"):
    """numpy (ml_dtypes included) -> a torch tensor on `device` with the same dtype and bits;
    None stays None."""
    import torch
    if a is None:
        return None
    if a.dtype == ref.BF16:
        return torch.from_numpy(a.view(np.uint16).copy()).view(torch.bfloat16).to(device)
    if a.dtype == ref.FP8:
        return torch.from_numpy(a.view(np.uint8).copy()).view(torch.float8_e4m3fn).to(device)
    return torch.from_numpy(np.ascontiguousarray(a)).to(device)


def to_host(t):
    """A torch tensor -> float64 numpy."""
    return t.detach().float().cpu().numpy().astype(np.float64)


def tree_mask(rng, batch, q_len):
    """[batch, q_len, ceil(q_len / 32)] uint32: each draft sees itself and a random subset of
    the earlier drafts."""
    words = (q_len + 31) // 32
    mask = np.zeros((batch, q_len, words), np.uint32)
    for b in range(batch):
        for i in range(q_len):
            for j in range(i + 1):
                if j == i or rng.random() < 0.5:
                    mask[b, i, j // 32] |= np.uint32(1 << (j % 32))
    return mask


def close(got, want, dtype, scale=1.0):
    """Within what rounding to `dtype` may change (one unit in the last place)."""
    got = np.asarray(got).astype(np.float64)
    rtol = {"bf16": 2.0 ** -7, "fp16": 2.0 ** -10, "fp32": 1e-5, "fp8_e4m3": 2.0 ** -3}[dtype]
    atol = {"fp8_e4m3": 2.0 ** -9 * scale}.get(dtype, 1e-6)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def close_lse(got, want):
    got = np.asarray(got, np.float64)
    assert np.array_equal(np.isneginf(got), np.isneginf(want))
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-5, atol=1e-5)
