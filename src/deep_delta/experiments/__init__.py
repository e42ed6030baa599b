"""Experiments built on training and evaluation: one study framework (:mod:`~deep_delta.experiments.study`:
variants x seeds x lrs, through :mod:`~deep_delta.experiments.scaling` widths x lengths, stored results checked,
OUT locked, interruption) and one report stack (:mod:`~deep_delta.experiments.report`), used by the language-model
comparisons (``ddl compare``: :mod:`~deep_delta.experiments.compare`, :mod:`~deep_delta.experiments.compare_report`)
and the mechanism tasks (``ddl tasks run``: :mod:`~deep_delta.experiments.task_runs`,
:mod:`~deep_delta.experiments.tasks`, :mod:`~deep_delta.experiments.task_report`); the statistics, lr grids, the
look inside trained models and the muP coordinate check. This layer may import every package below it (train,
eval, models, data, tasks); nothing below imports it.

    from deep_delta.experiments.runner import run_plan
    from deep_delta.experiments.plan import build_plan
    base = TrainConfig(preset="tiny", steps=200)
    summary = run_plan(build_plan(base, ["baseline", "ddl-cc"], seeds=[0, 1, 2]), base, "runs/cmp")
"""
