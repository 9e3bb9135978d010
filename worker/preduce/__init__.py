"""Partial reduce: workers average their models in small groups formed by the grouper (issue 20)."""
