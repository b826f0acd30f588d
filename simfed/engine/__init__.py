"""The discrete-event engine: actors, step programs, the SimPy run, and its summary."""

from .run import AlgorithmRun, aggregate_steps, simulate, simulate_algorithm

__all__ = ["AlgorithmRun", "aggregate_steps", "simulate", "simulate_algorithm"]
