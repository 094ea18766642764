"""A stand-in for FlashAttention-2's `flash_attn` package where it is not installed:
FlashAttention-3's kv-cache test imports its rotary reference from it
(flash_attn.layers.rotary.apply_rotary_emb)."""
