"""``ddl coord-check``: the muP coordinate check, activation size against width under sp and mup."""

from __future__ import annotations

import argparse

from deep_delta.cli import options

# Where the command's defaults differ from CoordCheckSettings': the device is chosen here, then resolved.
COMMAND_DEFAULTS = {"device": "auto"}


def add_parser(sub) -> None:
    from deep_delta.experiments.settings import MUP_SLOPE_BOUND, CoordCheckSettings

    p = sub.add_parser(
        "coord-check",
        help="muP coordinate check: how each activation's size and change since init move with the width, sp and "
        "mup side by side",
        description="For each VARIANT, width and parametrization (sp, mup), train a fresh model a few AdamW steps "
        "on the embedded text and record, on one fixed probe batch at init and after each step, the size mean "
        "|x_t| and the change since init mean |x_t - x_0| of each activation type (embedding, attention and MLP "
        "outputs, residual update, state X, read x_in, k^T X, v, beta and their pre-activations, the dynamic "
        "HC / mHC coefficients' pre-activations, logits). Width = hidden_size at a fixed head size and depth. "
        "Prints the log-log slopes of both against width and writes OUT/coord_check.json, OUT/coord_check.md and "
        "OUT/coord_check.png. Exits 1 when the slope of a change under mup after the last step misses its muP "
        "order by more than --bound (docs/mup.md).",
    )
    options.add_settings(p, CoordCheckSettings, defaults=COMMAND_DEFAULTS)
    p.add_argument("--bound", type=options.real, default=MUP_SLOPE_BOUND,
                   help=f"largest |slope of a change - muP order| after the last step that passes "
                   f"(default {MUP_SLOPE_BOUND})")
    p.add_argument("--out", default="runs/coord_check", help="output directory (default runs/coord_check)")
    options.add_threads(p)
    options.add_set(p, help="set a model (DDLConfig) field for every model: model.FIELD=VALUE, e.g. "
                    "model.mup_base_width=128. Repeatable")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from deep_delta.experiments.coord_check import run_coord_check, verdict_line, write_coord_check
    from deep_delta.experiments.report import figures_note, has_matplotlib
    from deep_delta.experiments.settings import CoordCheckSettings
    from deep_delta.fsutil import refuse_replaced_dir, refuse_unwritable_results
    from deep_delta.runtime import resolve_device
    from deep_delta.settings import parse_assignments

    overrides = parse_assignments(args.assignments)
    bad = [k for k in overrides if k != "model"]
    if bad:
        raise ValueError(f"`assignments` got {bad!r}; allowed here: model.FIELD=VALUE (a DDLConfig field)")
    given = {**COMMAND_DEFAULTS, **options.given_settings(args, options.setting_names(CoordCheckSettings))}
    given["device"] = str(resolve_device(given["device"]))
    settings = CoordCheckSettings(**given, model=overrides.get("model", {}))
    out = Path(args.out)
    refuse_replaced_dir(out)
    refuse_unwritable_results(out / f"coord_check.{ext}" for ext in ("json", "md", "png"))
    threads = options.apply_threads(args.threads)
    print(f"ddl coord-check: {', '.join(settings.variants)} at widths {' '.join(map(str, settings.widths))}, "
          f"{settings.steps} steps, {' and '.join(settings.parametrizations)}, on {settings.device}"
          + (f" ({threads} threads)" if threads else ""), flush=True)
    report = run_coord_check(settings, progress=lambda line: print("  " + line, flush=True))
    table, failed = write_coord_check(out, report, args.bound)
    drawn = has_matplotlib()
    print()
    print(table)
    print(verdict_line(report["settings"], args.bound, failed))
    print(f"wrote {out / 'coord_check.json'}, {out / 'coord_check.md'}"
          + (f", {out / 'coord_check.png'}" if drawn else f"; {figures_note(['coord_check.png'])}"))
    return 1 if failed else 0
