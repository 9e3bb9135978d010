"""Simulated load without torch: agents that speak the real protocol, many per process (fleet),
and metric traces with known stragglers (traces)."""
