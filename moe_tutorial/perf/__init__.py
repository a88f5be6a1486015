"""Measuring the implementations: bytes and FLOPs, ceilings, timers, the benchmark sweep, the tuner, reports.

The command line that drives them is :mod:`moe_tutorial.cli`; one-off experiments live in
:mod:`moe_tutorial.experiments`.
"""
