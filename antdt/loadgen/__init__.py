"""Simulated agents for scale tests: many workers per process speaking the real protocol, without
torch."""
