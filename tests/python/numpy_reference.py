"""An independent numpy implementation of deca's ops, for the Python tests.

Written from docs/semantics.md, not from src/cpu/: every request's K and V are gathered into dense
float64 matrices first, the visibility of each key is a boolean mask built from the positions,
and the softmax is taken over the whole row in float64. Conversions come from ml_dtypes.
"""

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)


def to_f64(x, dtype=None):
    """Real values of a stored array: ml_dtypes / numpy dtypes, or raw bits with `dtype`."""
    x = np.asarray(x)
    if dtype == "bf16":
        x = x.view(BF16)
    elif dtype == "fp16":
        x = x.view(np.float16)
    elif dtype == "fp8_e4m3":
        x = x.view(FP8)
    return x.astype(np.float64)


def gather_kv(cache, page_table_row, n, layout):
    """[n, num_kv_heads, head_dim] float64 rows of one request, token order."""
    page_size = cache.shape[1] if layout == "NHD" else cache.shape[2]
    t = np.arange(n)
    pages = page_table_row[t // page_size]
    slots = t % page_size
    if layout == "NHD":
        return cache[pages, slots, :, :]
    return cache[pages, :, slots, :]


def gqa_visible(n, q_len, i, window, mask_row):
    """Boolean [n]: keys query token i of a request with n cached tokens sees."""
    t = np.arange(n)
    p = n - q_len + i
    visible = t <= p
    if mask_row is not None:
        draft = t >= n - q_len
        j = t[draft] - (n - q_len)
        bits = (mask_row[j // 32].astype(np.uint64) >> (j % 32).astype(np.uint64)) & 1
        visible[draft] = bits.astype(bool)
    if window > 0:
        visible &= t > p - window
    return visible


def softmax_rows(logits, visible, sink):
    """(weights [n], lse) over the visible entries; sink joins the denominator only."""
    if not visible.any():
        return np.zeros_like(logits), -np.inf
    vis = logits[visible]
    m = vis.max()
    if sink is not None and np.isposinf(sink):  # the sink takes all the weight
        return np.zeros_like(logits), m + np.log(np.where(visible, np.exp(logits - m), 0).sum())
    if sink is not None:
        m = max(m, sink)
    e = np.where(visible, np.exp(logits - m), 0.0)
    total = e.sum()
    denom = total + (np.exp(sink - m) if sink is not None else 0.0)
    return e / denom, m + np.log(total)


def skip_tiles(logits, visible, factor, span, tile=64):
    """Skip-softmax (docs/semantics.md): the visible mask with the dropped tiles cleared. Tiles of
    `tile` keys from key 0 in ascending order; a tile whose largest visible logit is below
    log(factor / span) plus the largest logit of the tiles kept before it is dropped."""
    kept = visible.copy()
    m_ref = -np.inf
    for t0 in range(0, len(logits), tile):
        seen = visible[t0:t0 + tile]
        if not seen.any():
            continue
        m_t = logits[t0:t0 + tile][seen].max()
        if m_t < m_ref + np.log(factor) - np.log(span):
            kept[t0:t0 + tile] = False
        else:
            m_ref = max(m_ref, m_t)
    return kept


def gqa_decode(q, k, v, page_table, seq_lens, *, layout="NHD", k_scale=1.0, v_scale=1.0,
               k_scales=None, v_scales=None, softmax_scale=None, softcap=0.0, window=0,
               sinks=None, tree_mask=None, skip_softmax_factor=0.0):
    """q, k, v: float64 real values (k / v before scaling). Returns (out, lse) float64."""
    batch, q_len, hq, d = q.shape
    hkv = k.shape[2] if layout == "NHD" else k.shape[1]
    group = hq // hkv
    scale = softmax_scale if softmax_scale else 1.0 / np.sqrt(d)
    ks = np.asarray(k_scales, np.float64) if k_scales is not None else np.full(hkv, k_scale)
    vs = np.asarray(v_scales, np.float64) if v_scales is not None else np.full(hkv, v_scale)
    out = np.zeros((batch, q_len, hq, d))
    lse = np.full((batch, q_len, hq), -np.inf)
    for b in range(batch):
        n = int(seq_lens[b])
        kb = gather_kv(k, page_table[b], n, layout) * ks[None, :, None]
        vb = gather_kv(v, page_table[b], n, layout) * vs[None, :, None]
        for i in range(q_len):
            visible = gqa_visible(n, q_len, i, window,
                                  tree_mask[b, i] if tree_mask is not None else None)
            for h in range(hq):
                logits = scale * (kb[:, h // group, :] @ q[b, i, h])
                if softcap:
                    logits = softcap * np.tanh(logits / softcap)
                seen = visible
                if skip_softmax_factor > 0:
                    p = n - q_len + i
                    span = min(p + 1, window) if window > 0 else p + 1
                    if tree_mask is not None:
                        span += q_len - 1 - i  # later drafts: the mask may show them
                    seen = skip_tiles(logits, visible, skip_softmax_factor, span)
                w, lse[b, i, h] = softmax_rows(logits, seen,
                                               float(sinks[h]) if sinks is not None else None)
                out[b, i, h] = w @ vb[:, h // group, :]
    return out, lse


def mla_dense(q, kv, block_table, seqlens, softmax_scale=None):
    """q [b, s, h, 576], kv [blocks, page, 1, 576] float64. Causal over the s new tokens."""
    batch, q_len, heads, dqk = q.shape
    page = kv.shape[1]
    scale = softmax_scale if softmax_scale else 1.0 / np.sqrt(dqk)
    out = np.zeros((batch, q_len, heads, 512))
    lse = np.full((batch, q_len, heads), -np.inf)
    for b in range(batch):
        n = int(seqlens[b])
        t = np.arange(n)
        rows = kv[block_table[b][t // page], t % page, 0, :]  # [n, 576]
        for i in range(q_len):
            visible = t <= n - q_len + i
            for h in range(heads):
                w, lse[b, i, h] = softmax_rows(scale * (rows @ q[b, i, h]), visible, None)
                out[b, i, h] = w @ rows[:, :512]
    return out, lse


def unpack_fp8_token(token_bytes):
    """One 656-byte MLA token -> 576 float64 values (own reading of the documented format)."""
    nope = token_bytes[:512].view(FP8).astype(np.float64)
    scales = token_bytes[512:528].view(np.float32).astype(np.float64)
    rope = token_bytes[528:656].view(BF16).astype(np.float64)
    return np.concatenate([nope * np.repeat(scales, 128), rope])


def model1_block_bytes(cache, block):
    """The page bytes of block `block` of a MODEL1 cache view [blocks, page, 1, 584] (slot
    stride 584: the page's page * 584 bytes are contiguous from the block's start)."""
    page = cache.shape[1]
    return np.lib.stride_tricks.as_strided(cache[block], (page * 584,), (1,), writeable=False)


def unpack_model1_token(cache, x):
    """Token x of a MODEL1 cache -> 512 float64 values (own reading of the documented layout):
    its row at slot * 576 (448 e4m3, 64 bf16), its 7 ue8m0 scales at page * 576 + slot * 8."""
    page = cache.shape[1]
    block, slot = divmod(int(x), page)
    data = model1_block_bytes(cache, block)
    row = data[slot * 576:(slot + 1) * 576].copy()
    exps = data[page * 576 + slot * 8:page * 576 + slot * 8 + 7].astype(np.float64)
    scales = np.where(exps == 255, np.nan, 2.0 ** (exps - 127))
    nope = row[:448].view(FP8).astype(np.float64) * np.repeat(scales, 64)
    return np.concatenate([nope, row[448:].view(BF16).astype(np.float64)])


def _selected_rows(cache, indices, lengths, b, i, unpack, dim):
    ids = indices[b, i]
    if lengths is not None:
        ids = ids[:int(lengths[b])]
    ids = ids[ids >= 0]  # duplicates stay: they count twice
    page = cache.shape[1]
    if unpack is unpack_fp8_token:
        rows = [unpack(cache[x // page, x % page, 0]) for x in ids]
    else:
        rows = [unpack(cache, x) for x in ids]
    return np.array(rows).reshape(len(ids), dim)


def mla_sparse(q, kv_bytes, indices, topk_length=None, attn_sink=None, softmax_scale=None,
               extra=None):
    """q [b, s, h, 576] float64; kv_bytes [blocks, page, 1, 656] uint8; indices [b, s, topk].
    MODEL1 (q [.., 512], kv_bytes the [blocks, page, 1, 584] page view): V is the whole row;
    extra = (extra_kv_bytes, extra_indices, extra_topk_length) adds the second cache's selected
    rows to the same softmax."""
    batch, q_len, heads, dqk = q.shape
    unpack = unpack_model1_token if dqk == 512 else unpack_fp8_token
    scale = softmax_scale if softmax_scale else 1.0 / np.sqrt(dqk)
    out = np.zeros((batch, q_len, heads, 512))
    lse = np.full((batch, q_len, heads), -np.inf)
    for b in range(batch):
        for i in range(q_len):
            rows = _selected_rows(kv_bytes, indices, topk_length, b, i, unpack, dqk)
            if extra is not None:
                rows = np.concatenate([rows, _selected_rows(extra[0], extra[1], extra[2], b, i,
                                                            unpack, dqk)])
            visible = np.ones(len(rows), bool)
            for h in range(heads):
                sink = float(attn_sink[h]) if attn_sink is not None else None
                w, lse[b, i, h] = softmax_rows(scale * (rows @ q[b, i, h]), visible, sink)
                out[b, i, h] = w @ rows[:, :512] if len(rows) else 0.0
    return out, lse


def combine(partial_out, partial_lse, attn_sink=None):
    """Merge by LSE in float64; splits at -inf are skipped; all -inf rows give zeros, -inf."""
    po = partial_out.astype(np.float64)
    pl = partial_lse.astype(np.float64)
    splits, batch, q_len, heads, dv = po.shape
    out = np.zeros((batch, q_len, heads, dv))
    lse = np.full((batch, q_len, heads), -np.inf)
    for b in range(batch):
        for i in range(q_len):
            for h in range(heads):
                ls = pl[:, b, i, h]
                live = np.isfinite(ls)
                if not live.any():
                    continue
                m = ls[live].max()
                w = np.exp(ls[live] - m)
                total = w.sum()
                denom = total + (np.exp(attn_sink[h] - m) if attn_sink is not None else 0.0)
                out[b, i, h] = (w[:, None] * po[live, b, i, h]).sum(0) / denom
                lse[b, i, h] = m + np.log(total)
    return out, lse
