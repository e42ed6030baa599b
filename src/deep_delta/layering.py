"""The package's layers, bottom up, as data: which modules belong to each layer and which layers it may import.

A module imports only modules of its own layer and of the layers it names here, never one above; and no chain of
imports, function-local ones included, runs in a circle. ``tests/test_layering.py`` checks every import of the
package against this table, and docs/architecture.md's table of layers is rendered from it (``python -m
deep_delta.layering`` prints it; the test fails when the doc's copy differs). No PyTorch import.
"""

from __future__ import annotations

# (layer, its files and packages under src/deep_delta/, the layers it may import), bottom up
LAYERS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("utilities", ("__init__.py", "_lazy.py", "extras.py", "fsutil.py", "layering.py", "runtime.py", "settings.py",
                   "variants.py"), ()),
    ("math", ("ops/",), ("utilities",)),
    ("layers", ("layers/",), ("math", "utilities")),
    ("designs", ("designs/",), ("layers", "math", "utilities")),
    ("model", ("models/",), ("designs", "layers", "math", "utilities")),
    ("data", ("data/",), ("utilities",)),
    ("training", ("train/",), ("model", "designs", "math", "data", "utilities")),
    ("tasks", ("tasks/",), ("model", "utilities")),
    ("Hugging Face", ("hf/",), ("training", "model", "designs", "data", "utilities")),
    ("evaluation", ("eval/",), ("Hugging Face", "training", "model", "designs", "math", "data", "utilities")),
    ("experiments", ("experiments/",),
     ("evaluation", "Hugging Face", "tasks", "training", "model", "designs", "layers", "math", "data", "utilities")),
    ("command line", ("cli/",),
     ("experiments", "evaluation", "Hugging Face", "tasks", "training", "data", "model", "designs", "layers", "math",
      "utilities")),
)


def module_name(member: str) -> str:
    """The dotted name of a member of :data:`LAYERS`: ``ops/`` -> ``deep_delta.ops``, ``fsutil.py`` ->
    ``deep_delta.fsutil``, ``__init__.py`` -> ``deep_delta``."""
    if member == "__init__.py":
        return "deep_delta"
    return "deep_delta." + member.removesuffix("/").removesuffix(".py").replace("/", ".")


def layer_of(module: str) -> str:
    """The layer of a module of the package (its dotted name): the one whose entry is the module or the package
    holding it (the longest such entry). ``ValueError`` for a module no layer holds."""
    best = None
    for name, members, _ in LAYERS:
        for member in map(module_name, members):
            if (module == member or module.startswith(member + ".")) and (best is None or len(member) > len(best[1])):
                best = (name, member)
    if best is None:
        raise ValueError(f"`module` got {module!r}; allowed: a module of the package that a layer of LAYERS holds")
    return best[0]


def may_import(importer: str, imported: str) -> bool:
    """Whether module ``importer`` may import module ``imported``: the same layer, or one it names."""
    a, b = layer_of(importer), layer_of(imported)
    return a == b or b in dict((n, allowed) for n, _, allowed in LAYERS)[a]


def markdown() -> str:
    """The table of layers docs/architecture.md shows (bottom up)."""
    lines = ["| layer | modules | may import |", "| --- | --- | --- |"]
    for name, members, allowed in LAYERS:
        shown = ", ".join(f"`{m}`" for m in members)
        lines.append(f"| {name} | {shown} | {', '.join(allowed) or 'nothing of ours'} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown())
