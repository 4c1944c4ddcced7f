"""Models for demos, tests and benchmarks."""
