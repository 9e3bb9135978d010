"""Batch sizing for synchronous training: the step-time model shared by the controller's AntDT-DD
and the in-band sizer."""
