"""The optimization workflow behind ``superkernel optimize/analyze/bench``.

structure (module roles) -> strategies (scopes) -> analysis (trial capture) ->
measure (baselines, plans, precision) -> results/table/chart/report -> plan_file
(superkernel.yaml and ``superkernel.apply``); workflow.py and bench.py tie them together.
"""
