"""A stand-in for `triton` where it is not installed: FlashMLA's kernelkit imports it for its
timing helpers, which tools/peer_suites.py does not call (every case runs with num_runs 0)."""
