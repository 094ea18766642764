"""Drop-in signatures of the decode calls inference engines make, on deca's own API.

* flash_attn_with_kvcache -- FlashAttention's paged decode call (vLLM's FlashAttention backend);
* BatchDecodeWithPagedKVCacheWrapper -- FlashInfer's plan / run decode wrapper (CSR page lists,
  combined K/V cache, base-2 LSE);
* get_mla_metadata, flash_mla_with_kvcache -- FlashMLA's MLA decode (sparse FP8, dense bf16).

Each keeps its library's argument names, shapes and return convention; what deca cannot honour
raises deca.Error naming the argument. Under torch.compile every call goes through a torch custom
op (torch.ops.deca.gqa_decode / mla_decode_sparse / mla_decode_dense), so the compiled graph
keeps it as one node; in eager mode (and for numpy / cupy) the wrappers call deca directly,
which CUDA graphs capture as they are. Plans and workspaces are cached per shape: make the first
call of a shape before capturing.
"""

import sys

# A look in sys.modules is fine here: this runs at import, never in code torch.compile traces.
if "torch" in sys.modules:
    from .. import torch_ops  # noqa: F401  (the custom ops exist before anything is compiled)
from .flash_attn import flash_attn_with_kvcache
from .flash_mla import MlaMetadata, flash_mla_with_kvcache, get_mla_metadata
from .flashinfer import BatchDecodeWithPagedKVCacheWrapper, csr_to_page_table

__all__ = [
    "flash_attn_with_kvcache", "BatchDecodeWithPagedKVCacheWrapper", "csr_to_page_table",
    "get_mla_metadata", "flash_mla_with_kvcache", "MlaMetadata",
]
