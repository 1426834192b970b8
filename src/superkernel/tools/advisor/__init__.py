"""The optimization workflow behind ``superkernel optimize/analyze/bench``, in data-flow order.

structure (module roles) -> strategies (scopes per strategy) -> analysis (trial capture of each plan) ->
profile, profile_rounds (where the eager decode step spends its time) -> predict (each plan's predicted
gain) -> search (which plans are measured, best predicted first; retime: kept plans timed again,
interleaved) -> compiling, measure (baselines and plans, with precision) -> results (the recommendation) ->
table, console, chart, profile_chart, optimize_report, profile_report (what the user reads) -> plan_file
(``superkernel.yaml``, ``superkernel.apply``). workflow.py ties them together for ``optimize`` and
``analyze``, plan_bench.py for ``bench``; progress, run_log and environment serve all three.
"""
