"""Benchmarks: scripts that print numbers (never timed assertions in the test suite)."""
