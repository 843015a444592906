"""Shared helpers of the tests: random cases, buffer placements, guarded buffers, cache views, the remote peer, the command line in-process."""
