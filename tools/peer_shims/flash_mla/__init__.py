"""`flash_mla` for FlashMLA's own tests, run against deca (tools/peer_suites.py): FlashMLA's two
decode entry points are deca.compat's. Anything else the tests reach for is not provided."""

from deca.compat import flash_mla_with_kvcache, get_mla_metadata  # noqa: F401


def __getattr__(name):
    raise AttributeError(f"flash_mla.{name}: deca.compat provides get_mla_metadata and "
                         f"flash_mla_with_kvcache only")
