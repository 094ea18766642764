"""The fused decode step (GqaPlan.run_fused, deca.gqa_decode_fused, the FlashInfer wrapper's
run_fused) against "rotate, append, then decode" done separately: the rotation and the append in
numpy (fp32 products, rounding to q's dtype, the cache's quantisation), then deca.gqa_decode. On
the CPU both paths reach the same reference, so the caches and outputs match byte for byte."""

import numpy as np
import pytest

import deca
import deca.compat as compat
import numpy_reference as ref
from cases import PagedCase, store

_Q_NP = {"bf16": ref.BF16, "fp16": np.float16}


def _cos_sin(max_position, rotary_dim):
    half = rotary_dim // 2
    inv = 10000.0 ** (-np.arange(half) * 2.0 / rotary_dim)
    ang = np.arange(max_position)[:, None] * inv[None, :]
    return np.concatenate([np.cos(ang), np.sin(ang)], axis=1).astype(np.float32)


def _rotate(x, pos, cos_sin, style):
    """x [..., d] in q's numpy dtype at positions pos (broadcast over heads) -> rotated, rounded
    to x's dtype: fp32 products, then their sum (numpy applies no fused multiply-add)."""
    rd = cos_sin.shape[1]
    half = rd // 2
    f = x.astype(np.float32)
    c = cos_sin[pos][..., None, :half]
    s = cos_sin[pos][..., None, half:]
    a = np.arange(half) if style == "neox" else 2 * np.arange(half)
    b = a + half if style == "neox" else a + 1
    xa, xb = f[..., a], f[..., b]
    out = f.copy()
    out[..., a] = xa * c - xb * s
    out[..., b] = xb * c + xa * s
    return out.astype(x.dtype)


class FusedCase:
    """A PagedCase whose last q_len slots per request are this step's (poisoned in the cache),
    with k_new / v_new, a cos/sin cache and positions."""

    def __init__(self, rng, *, style="neox", rotary_dim=None, positions=False, **kw):
        self.c = PagedCase(rng, **kw)
        c = self.c
        batch, q_len, hq, d = c.q.shape
        self.layout = c.layout
        self.kv_dtype = kw.get("kv_dtype", "bf16")
        self.q_dtype = kw.get("q_dtype", "bf16")
        hkv = c.k.shape[2] if c.layout == "NHD" else c.k.shape[1]
        self.style = style
        self.rotary_dim = rotary_dim or d
        self.k_new = rng.standard_normal((batch, q_len, hkv, d)).astype(_Q_NP[self.q_dtype])
        self.v_new = rng.standard_normal((batch, q_len, hkv, d)).astype(_Q_NP[self.q_dtype])
        self.cos_sin = _cos_sin(int(c.seq_lens.max()) + 8, self.rotary_dim)
        slots = c.seq_lens[:, None] - q_len + np.arange(q_len)[None, :]
        self.pos = (slots + (np.arange(batch)[:, None] % 3 if positions else 0)).astype(np.int32)
        self.positions = self.pos if positions else None
        self.page_size = c.k.shape[1] if c.layout == "NHD" else c.k.shape[2]
        for b in range(batch):
            for t in slots[b]:
                if c.seq_lens[b] == 0:
                    continue
                self._slot(c.k, b, t)[...] = np.nan if self.kv_dtype != "int8" else 127
                self._slot(c.v, b, t)[...] = np.nan if self.kv_dtype != "int8" else 127

    def _slot(self, cache, b, t):
        pg = self.c.page_table[b, t // self.page_size]
        s = t % self.page_size
        return cache[pg, s] if self.layout == "NHD" else cache[pg, :, s]

    def scales(self):
        c = self.c
        if c.k_scales is None:
            return dict(k_scale=c.k_scale, v_scale=c.v_scale)
        return dict(k_scales=c.k_scales, v_scales=c.v_scales)

    def separately(self):
        """(rotated q, K cache, V cache) as a rotary kernel and a cache append would leave them."""
        c = self.c
        q_len = c.q.shape[1]
        live = c.seq_lens > 0
        pos = np.where(live[:, None], self.pos, 0)
        q_rot = np.where(live[:, None, None, None], _rotate(c.q, pos, self.cos_sin, self.style), c.q)
        k_rot = _rotate(self.k_new, pos, self.cos_sin, self.style)
        k, v = c.k.copy(), c.v.copy()
        for b in range(len(c.seq_lens)):
            if not live[b]:
                continue
            for i in range(q_len):
                t = int(c.seq_lens[b]) - q_len + i
                ks = c.k_scales if c.k_scales is not None else np.float32(c.k_scale)
                vs = c.v_scales if c.v_scales is not None else np.float32(c.v_scale)
                ks = np.asarray(ks, np.float32)[:, None] if np.ndim(ks) else ks
                vs = np.asarray(vs, np.float32)[:, None] if np.ndim(vs) else vs
                self._slot(k, b, t)[...] = store(k_rot[b, i].astype(np.float32), self.kv_dtype, ks)[0]
                self._slot(v, b, t)[...] = store(self.v_new[b, i].astype(np.float32), self.kv_dtype, vs)[0]
        return q_rot, k, v


def _bytes_equal(a, b):
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    assert a.shape == b.shape
    np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


FUSED = [
    ("neox-bf16", dict(seq_lens=[17, 32, 1], hq=8, hkv=2, d=64, page=16)),
    ("gptj-partial32-hnd", dict(seq_lens=[9, 16], hq=4, hkv=2, d=64, page=8, layout="HND",
                                style="gptj", rotary_dim=32)),
    ("fp16-positions", dict(seq_lens=[20, 5], hq=4, hkv=4, d=32, page=4, q_dtype="fp16",
                            kv_dtype="fp16", positions=True)),
    ("fp8-per-tensor", dict(seq_lens=[40, 23], hq=8, hkv=2, d=64, page=16, kv_dtype="fp8_e4m3",
                            k_scale=0.02, v_scale=0.03)),
    ("int8-per-head", dict(seq_lens=[33, 9], hq=8, hkv=2, d=64, page=8, kv_dtype="int8",
                           k_scale=0.03, v_scale=0.02, per_head=True)),
    ("q3-first-token-and-empty", dict(seq_lens=[3, 0, 18], q_len=3, hq=4, hkv=2, d=32, page=16,
                                      style="gptj")),
]


@pytest.mark.parametrize("name,kw", FUSED, ids=[f[0] for f in FUSED])
def test_fused_equals_rotate_append_decode(rng, name, kw):
    f = FusedCase(rng, **kw)
    c = f.c
    q_rot, k_want, v_want = f.separately()
    want, want_lse = deca.gqa_decode(q_rot, k_want, v_want, c.page_table, c.seq_lens,
                                     layout=f.layout, return_lse=True, **f.scales())
    q_before = c.q.copy()
    out = np.empty_like(c.q)
    lse = np.empty(c.q.shape[:3], np.float32)
    got = deca.gqa_decode_fused(c.q, f.k_new, f.v_new, f.cos_sin, c.k, c.v, c.page_table,
                                c.seq_lens, out, positions=f.positions, rope_style=f.style,
                                layout=f.layout, lse=lse, **f.scales())
    assert got is out
    _bytes_equal(c.q, q_before)
    _bytes_equal(c.k, k_want)
    _bytes_equal(c.v, v_want)
    _bytes_equal(out, want)
    _bytes_equal(lse, want_lse)


def test_plan_run_fused_with_tree_mask_and_window(rng):
    f = FusedCase(rng, seq_lens=[30, 4], q_len=4, hq=8, hkv=2, d=64, page=16)
    c = f.c
    mask = np.zeros((2, 4, 1), np.uint32)
    for i in range(4):
        mask[:, i, 0] = (1 << (i + 1)) - 1 if i != 2 else 0b101
    q_rot, k_want, v_want = f.separately()
    want = deca.gqa_decode(q_rot, k_want, v_want, c.page_table, c.seq_lens, tree_mask=mask,
                           window=9)
    plan = deca.GqaPlan(8, 2, 64, 16, max_seq_len=64, max_batch=2, max_q_len=4, tree_mask=True,
                        window=9, rope_style="neox")
    assert plan.config.rope_style == "neox" and plan.config.rotary_dim == 0
    out = np.empty_like(c.q)
    plan.run_fused(c.q, f.k_new, f.v_new, f.cos_sin, c.k, c.v, c.page_table, c.seq_lens, out,
                   tree_mask=mask)
    _bytes_equal(c.k, k_want)
    _bytes_equal(out, want)


def test_errors_name_the_argument(rng):
    f = FusedCase(rng, seq_lens=[5], hq=4, hkv=2, d=32, page=8)
    c = f.c
    out = np.empty_like(c.q)
    plain = deca.GqaPlan(4, 2, 32, 8, max_seq_len=16)
    with pytest.raises(deca.Error, match=r"gqa_decode: k_new: expected absent \(plan.config.rope_style != kNone is false\)"):
        plain.run_fused(c.q, f.k_new, f.v_new, f.cos_sin, c.k, c.v, c.page_table, c.seq_lens, out)
    with pytest.raises(deca.Error, match="rotary_dim"):
        deca.GqaPlan(4, 2, 32, 8, max_seq_len=16, rope_style="neox", rotary_dim=24)
    with pytest.raises(deca.Error, match="rope_style"):
        deca.GqaPlan(4, 2, 32, 8, max_seq_len=16, rope_style="llama3")
    plan = deca.GqaPlan(4, 2, 32, 8, max_seq_len=16, rope_style="gptj", rotary_dim=16)
    with pytest.raises(deca.Error, match="gqa_decode: cos_sin_cache: dim 1"):
        plan.run_fused(c.q, f.k_new, f.v_new, f.cos_sin, c.k, c.v, c.page_table, c.seq_lens, out)
    short = f.cos_sin[:4, :16].copy()
    with pytest.raises(deca.Error, match=r"seq_lens\[0\] - q_len \+ 0"):
        plan.run_fused(c.q, f.k_new, f.v_new, short, c.k, c.v, c.page_table, c.seq_lens, out)


def test_flashinfer_run_fused_is_rope_append_then_run(rng):
    f = FusedCase(rng, seq_lens=[20, 9, 1], hq=8, hkv=2, d=64, page=8, positions=True)
    c = f.c
    counts = [-(-int(n) // 8) for n in c.seq_lens]
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    indices = np.concatenate([c.page_table[b, :n] for b, n in enumerate(counts)]).astype(np.int32)
    last = np.array([(int(n) - 1) % 8 + 1 for n in c.seq_lens], np.int32)
    q_rot, k_want, v_want = f.separately()
    w = compat.BatchDecodeWithPagedKVCacheWrapper(np.zeros(16, np.uint8))
    w.plan(indptr, indices, last, 8, 2, 64, 8, q_data_type="bfloat16")
    want = w.run(q_rot[:, 0], (k_want, v_want))
    positions64 = f.positions[:, 0].astype(np.int64)  # vLLM passes int64 positions
    out = w.run_fused(c.q[:, 0], f.k_new[:, 0], f.v_new[:, 0], (c.k, c.v), f.cos_sin,
                      positions=positions64, is_neox=True)
    _bytes_equal(c.k, k_want)
    _bytes_equal(c.v, v_want)
    _bytes_equal(out, want)


# --- torch tensors (CUDA when a GPU is present, else the CPU backend) --------------------------

try:
    import torch
except ImportError:
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not importable")


def _torch(a, dev):
    if a is None:
        return None
    if a.dtype == ref.BF16:
        return torch.from_numpy(a.view(np.uint16).copy()).view(torch.bfloat16).to(dev)
    if a.dtype == ref.FP8:
        return torch.from_numpy(a.view(np.uint8).copy()).view(torch.float8_e4m3fn).to(dev)
    return torch.from_numpy(np.ascontiguousarray(a)).to(dev)


def _same_bits(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype
    assert torch.equal(a.contiguous().reshape(-1).view(torch.uint8),
                       b.contiguous().reshape(-1).view(torch.uint8))


@needs_torch
@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_e4m3", "int8"])
def test_torch_fused_equals_rotate_append_decode(rng, kv_dtype):
    """On a GPU: the fused kernel (the Hopper fp8 one for fp8 at head_dim 128) against the
    plain kernel on the separately appended cache: caches and outputs bit for bit."""
    dev = "cuda:0" if torch.cuda.is_available() else "cpu"
    scale = 1.0 if kv_dtype == "bf16" else 0.03
    f = FusedCase(rng, seq_lens=[300, 17, 1, 64], q_len=1, hq=16, hkv=2, d=128, page=16,
                  kv_dtype=kv_dtype, k_scale=scale, v_scale=scale, positions=True)
    c = f.c
    q_rot, k_want, v_want = f.separately()
    T = lambda a: _torch(a, dev)  # noqa: E731
    k, v = T(c.k), T(c.v)
    out = torch.empty_like(T(c.q))
    # Fixed splits: both plans cut the keys alike whatever their kernels' occupancy.
    split = dict(split_mode="fixed", split_tokens=256)
    deca.gqa_decode_fused(T(c.q), T(f.k_new), T(f.v_new), T(f.cos_sin), k, v, T(c.page_table),
                          T(c.seq_lens), out, positions=T(f.positions), k_scale=scale,
                          v_scale=scale, **split)
    _same_bits(k, T(k_want))
    _same_bits(v, T(v_want))
    want = deca.gqa_decode(T(q_rot), T(k_want), T(v_want), T(c.page_table), T(c.seq_lens),
                           k_scale=scale, v_scale=scale, **split)
    _same_bits(out, want)


@needs_torch
def test_opcheck_gqa_decode_fused(rng):
    import deca.torch_ops  # noqa: F401
    dev = "cuda:0" if torch.cuda.is_available() else "cpu"
    f = FusedCase(rng, seq_lens=[20, 5], hq=8, hkv=2, d=64, page=16)
    c = f.c
    T = lambda a: _torch(a, dev)  # noqa: E731
    q = T(c.q)
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=dev)
    args = (q, T(f.k_new), T(f.v_new), T(f.cos_sin), None, T(c.k), T(c.v), T(c.page_table),
            T(c.seq_lens), out, lse, None, None, None, "neox", "NHD", 0, "", 1.0, 1.0, 0.0, 0.0,
            0, 1.0)
    torch.library.opcheck(torch.ops.deca.gqa_decode_fused.default, args)


@needs_torch
@pytest.mark.usefixtures("sys_modules_off_limits")
def test_torch_compile_holds_flashinfer_run_fused(rng):
    dev = "cuda:0" if torch.cuda.is_available() else "cpu"
    f = FusedCase(rng, seq_lens=[20, 9], hq=8, hkv=2, d=64, page=8, style="gptj")
    c = f.c
    counts = [-(-int(n) // 8) for n in c.seq_lens]
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    indices = np.concatenate([c.page_table[b, :n] for b, n in enumerate(counts)]).astype(np.int32)
    last = np.array([(int(n) - 1) % 8 + 1 for n in c.seq_lens], np.int32)
    T = lambda a: _torch(a, dev)  # noqa: E731
    w = compat.BatchDecodeWithPagedKVCacheWrapper(torch.empty(16, dtype=torch.uint8, device=dev))
    w.plan(T(indptr), T(indices), T(last), 8, 2, 64, 8, q_data_type=torch.bfloat16)
    k_eager, v_eager = T(c.k), T(c.v)
    args = (T(c.q)[:, 0], T(f.k_new)[:, 0], T(f.v_new)[:, 0])
    want = w.run_fused(*args, (k_eager, v_eager), T(f.cos_sin), is_neox=False)
    k, v = T(c.k), T(c.v)

    def step(q, k_new, v_new, k, v, cos_sin):
        return w.run_fused(q, k_new, v_new, (k, v), cos_sin, is_neox=False)

    got = torch.compile(step, fullgraph=True, backend="aot_eager")(*args, k, v, T(f.cos_sin))
    _same_bits(got, want)
    _same_bits(k, k_eager)
