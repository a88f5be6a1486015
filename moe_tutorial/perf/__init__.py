"""Measuring the implementations: bytes and FLOPs, timers, the benchmark sweep, the tuner, reports, the CLI."""
