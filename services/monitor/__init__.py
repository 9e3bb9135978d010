"""Monitor: a Faust app that detects and classifies stragglers and leaders (issue 5)."""
