"""Harnesses on top of decoder/, server/ and telemetry/: the CLI, the benchmark, evaluation cases."""
