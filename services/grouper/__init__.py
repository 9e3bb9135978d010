"""Grouper: forms the partial-reduce groups of ready workers, first come first served (issue 20)."""
