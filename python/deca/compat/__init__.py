"""Drop-in signatures of the decode calls inference engines make, on deca's own API.

* flash_attn_with_kvcache -- FlashAttention's paged decode call (vLLM's FlashAttention backend);
* BatchDecodeWithPagedKVCacheWrapper -- FlashInfer's plan / run decode wrapper (CSR page lists,
  combined K/V cache, base-2 LSE);
* get_mla_metadata, flash_mla_with_kvcache -- FlashMLA's MLA decode (sparse FP8, dense bf16).

Each keeps its library's argument names, shapes and return convention; what deca cannot honour
raises deca.Error naming the argument. With torch tensors every call goes through a torch custom
op (torch.ops.deca.gqa_decode / mla_decode_sparse / mla_decode_dense), so torch.compile keeps it
as one graph node and CUDA graphs capture it; plans and workspaces are cached per shape (make
the first call of a shape before capturing). numpy / cupy inputs call deca directly.
"""

from .flash_attn import flash_attn_with_kvcache
from .flash_mla import MlaMetadata, flash_mla_with_kvcache, get_mla_metadata
from .flashinfer import BatchDecodeWithPagedKVCacheWrapper, csr_to_page_table

__all__ = [
    "flash_attn_with_kvcache", "BatchDecodeWithPagedKVCacheWrapper", "csr_to_page_table",
    "get_mla_metadata", "flash_mla_with_kvcache", "MlaMetadata",
]
