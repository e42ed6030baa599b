"""The report stack every study writes with: the machine it ran on, numbers and intervals as text, the result
files (markdown, JSON and figures, each replaced atomically) and the study's W&B run.

A language-model comparison (:mod:`deep_delta.experiments.compare_report`), a mechanism-task study
(:mod:`deep_delta.experiments.task_report`) and the width / length study (:mod:`deep_delta.experiments.scaling`)
each say what their tables hold; writing and logging them is done here, once.
"""

from __future__ import annotations

import json
import math
import os
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any


def machine() -> dict[str, Any]:
    """What a result file records of the machine: platform, processor, cores, torch, threads, device, and the
    kernel switches of the process that wrote it (:func:`deep_delta.ops.switches.current`: the paths its own
    measurements, such as a comparison's step times, ran; each run's are in its run.json)."""
    import torch

    from deep_delta.ops import switches

    return {
        "kernel_switches": switches.current(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
    }


def fmt(x: float | None, spec: str, signed: bool = False) -> str:
    """``x`` formatted with ``spec`` (a leading + with ``signed``); "-" for a missing or non-finite value."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return format(x, ("+" if signed else "") + spec)


def ci_text(ci: list[float] | None, spec: str = "+.4f") -> str:
    """A 95% interval as ``[lo, hi]`` ("-" without one: a single seed)."""
    return f"[{ci[0]:{spec}}, {ci[1]:{spec}}]" if ci else "-"


def write_outputs(out: str | os.PathLike, stem: str, summary: dict[str, Any], markdown: str,
                  figures: dict[str, Callable[[Path], Any]] | None = None) -> list[Path]:
    """``OUT/<stem>.md`` and ``OUT/<stem>.json`` (every number of ``summary``), and each figure of ``figures``
    (file name -> a function drawing it to the path it is given), each replaced atomically: a figure is drawn
    to a temporary name and renamed, so a reader never sees half a file. Without matplotlib (the package installed
    without its ``plot`` extra) the figures are left out: the markdown loses their images and says which extra
    draws them (:func:`figures_note`, also in ``summary["notes"]``), and a figure of an earlier report there, which
    would no longer match, is removed. Returns the paths written."""
    from deep_delta.extras import installed
    from deep_delta.fsutil import atomic_write

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    figures = dict(figures or {})
    if figures and not installed("matplotlib"):
        note = figures_note(list(figures))
        summary.setdefault("notes", []).append(note)
        markdown = without_images(markdown, list(figures)).rstrip("\n") + f"\n\n{note}\n"
        for name in figures:
            (out / name).unlink(missing_ok=True)
        figures = {}
    written = []
    for name, draw in figures.items():
        tmp = out / f".{name}.tmp{Path(name).suffix}"
        draw(tmp)
        os.replace(tmp, out / name)
        written.append(out / name)
    atomic_write(out / f"{stem}.json", json.dumps(summary, indent=2) + "\n")
    atomic_write(out / f"{stem}.md", markdown)
    return [out / f"{stem}.md", out / f"{stem}.json", *written]


def figures_note(names: list[str] | None = None) -> str:
    """What a report without its figures says: which are missing and the extra that draws them."""
    from deep_delta.extras import install_hint

    which = f" ({', '.join(names)})" if names else ""
    return (f"The figures{which} are not drawn: matplotlib is not installed; `{install_hint('matplotlib')}` draws "
            "them (every number is in the tables and the JSON).")


def without_images(markdown: str, names: list[str]) -> str:
    """``markdown`` without the lines that show one of the images ``names`` (``![...](NAME)``)."""
    shown = tuple(f"]({name})" for name in names)
    return "\n".join(line for line in markdown.split("\n")
                     if not (line.lstrip().startswith("![") and line.rstrip().endswith(shown)))


def has_matplotlib() -> bool:
    """Whether figures can be drawn (matplotlib, the ``plot`` extra, is installed)."""
    from deep_delta.extras import installed

    return installed("matplotlib")


def cell(value: Any) -> Any:
    """A W&B table cell: numbers and text as they are, a list (a confidence interval) as its text."""
    return str(value) if isinstance(value, (list, tuple, dict)) else value


def log_study(out: str | os.PathLike, *, project: str | None, name: str, job_type: str, config: dict[str, Any],
              tables: dict[str, tuple[list[str], list[list]]], images: dict[str, Path],
              summary: dict[str, Any], group: str | None = None, keep_id: bool = False, say=print) -> None:
    """A study as one W&B run (``name``, ``job_type``, in ``group``): its ``tables`` (name -> columns, rows),
    ``images`` (name -> a PNG file, logged where it exists) and ``summary`` numbers. With ``keep_id`` the run's
    id is kept in ``OUT/wandb.json`` and a later start of the same study logs into the same run. Without W&B
    (no package, a refused login) one line says so."""
    from deep_delta.train.wandb_sink import read_wandb_file, start_wandb, write_wandb_file

    out = Path(out)
    saved = read_wandb_file(out, say=say) if keep_id else {}
    sink = start_wandb(project=project, name=name, group=group, job_type=job_type, config=config, directory=out,
                       run_id=saved.get("id"), say=say)
    if sink is None:
        return
    if keep_id:
        write_wandb_file(out, group=group, id=sink.id)
    for table, (columns, rows) in tables.items():
        sink.table(table, columns, [[cell(x) for x in row] for row in rows])
    for image, path in images.items():
        if Path(path).is_file():
            sink.image(image, path)
    sink.summary(summary)
    sink.close()


__all__ = ["ci_text", "figures_note", "fmt", "has_matplotlib", "log_study", "machine", "without_images",
           "write_outputs"]
