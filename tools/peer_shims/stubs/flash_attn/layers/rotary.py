"""apply_rotary_emb as FlashAttention-3's kv-cache test calls it (its reference for the rotary
part of flash_attn_with_kvcache), written in torch from the documented semantics: x [batch,
seqlen, nheads, headdim] rotated at positions seqlen_offsets + i (an int or [batch]) with cos /
sin [seqlen_ro, rotary_dim / 2], pairs (2j, 2j + 1) when interleaved, else (j, j + rotary_dim / 2);
products and sums in fp32, the result rounded to x's dtype; dims from rotary_dim on kept."""

import torch


def apply_rotary_emb(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0,
                     cu_seqlens=None, max_seqlen=None):
    if cu_seqlens is not None:
        raise ValueError("cu_seqlens: deca's stand-in rotates [batch, seqlen, ...] inputs "
                         "(varlen cases are deselected)")
    batch, seqlen = x.shape[:2]
    half = cos.shape[1]
    steps = torch.arange(seqlen, device=x.device)
    if isinstance(seqlen_offsets, torch.Tensor):
        pos = seqlen_offsets.to(torch.long).view(batch, 1) + steps.view(1, seqlen)
    else:
        pos = (int(seqlen_offsets) + steps).view(1, seqlen).expand(batch, seqlen)
    c = cos.float()[pos][:, :, None, :]
    s = sin.float()[pos][:, :, None, :]
    j = torch.arange(half, device=x.device)
    a = 2 * j if interleaved else j
    b = a + 1 if interleaved else j + half
    f = x.float()
    out = f.clone()
    out[..., a] = f[..., a] * c - f[..., b] * s
    out[..., b] = f[..., b] * c + f[..., a] * s
    out = out.to(x.dtype)
    if inplace:
        x.copy_(out)
        return x
    return out
