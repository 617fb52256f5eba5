"""Benchmarks (not tests): the pure model's decision rate, the actor binder against a bare
loop, and end-to-end admissions on a real control plane. Only `cli` imports this package.
"""
