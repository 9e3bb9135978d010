"""Controller: turns verdicts into signed, fenced mitigation commands (issue 6)."""
