"""The per-step trace: one line per step, read back as numbers."""

from __future__ import annotations

from antdt.demo.steptrace import COLUMNS, StepTrace, read_trace, trace_path


def test_a_trace_reads_back_what_was_written_and_appends_across_generations(tmp_path):
    path = trace_path(tmp_path, "w0")
    trace = StepTrace(path, flush_every=1)
    trace.write(0, 0.5, 32, 256, 0.001, 0.3, 0.02, 0.001, 2.3)
    trace.close()
    again = StepTrace(path)  # a restarted generation goes on in the same file
    again.write(1, 0.9, 0, 0, 0.0, 0.0, 0.01, 0.0, None)
    again.close()
    rows = read_trace(path)
    assert list(rows[0]) == list(COLUMNS) and len(rows) == 2
    assert rows[0]["samples"] == 32 and rows[0]["loss"] == 2.3 and rows[1]["loss"] is None
