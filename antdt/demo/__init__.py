"""The straggler demo and the end-to-end benchmark: scenarios, paced workers, the harness, the
report.

``antdt demo`` and ``antdt bench`` run a :class:`~antdt.demo.scenario.Scenario`
(workers, their speeds, straggler episodes, noise) through the real services
on a real broker, with worker processes training a real torch model, and
measure the wall time against the ideal the scenario allows.
"""
