"""Small real training steps used by the demo, the tests and the benchmarks."""
