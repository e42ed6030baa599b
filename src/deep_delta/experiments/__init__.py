"""Experiments built on training and evaluation: seeded variant comparisons (``ddl compare``) and their
statistics. This layer may import every package below it (train, eval, models, data); nothing below imports it.

    from deep_delta.experiments.compare import run_compare
    summary = run_compare(TrainConfig(preset="tiny", steps=200), ["baseline", "ddl-cc"], "runs/cmp", seeds=[0, 1, 2])
"""
