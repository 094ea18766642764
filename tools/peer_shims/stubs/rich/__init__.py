"""A stand-in for `rich` where it is not installed: FlashMLA's test script imports it for the
summary table of its main(), which tools/peer_suites.py does not run."""
