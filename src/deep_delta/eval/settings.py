"""What ``ddl bench`` and ``ddl bench-kernels`` measure: their settings, with no import of PyTorch (the
command line reads the defaults from here to build its parser; :meth:`resolved` loads the checks that need it).

The benchmark modules build on this one: ``timing.py`` takes the dtype names and :func:`check_dtype` from here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

from deep_delta.settings import check_count, check_fields, parse_assignments, setting
from deep_delta.train.config import CUDA_GRAPHS
from deep_delta.variants import DEFAULT_VARIANTS, PRESETS

# float32, or autocast over fp32 weights in bfloat16 / float16, as training runs (deep_delta.eval.timing)
BENCH_DTYPE_NAMES = ("float32", "bfloat16", "float16")
# (batch size, sequence length) per preset when not given
DEFAULT_SHAPES = {"tiny": (4, 256), "small": (8, 1024), "medium": (8, 1024)}
_SHAPES = ", ".join(f"{p} {b}x{t}" for p, (b, t) in DEFAULT_SHAPES.items())


def check_warmup(warmup: int, compile: bool) -> None:
    """Refuse timing a compiled step without warm-up: its first calls compile it, and timed they would report
    compilation (seconds) as the step (milliseconds)."""
    if compile and warmup < 1:
        raise ValueError(f"`warmup` got {warmup} with `compile`; allowed: at least 1 with `compile` (the first rounds "
                         "of a compiled step compile it: timed, compilation would be reported as the step)")


def check_dtype(dtype: str) -> None:
    """Refuse a precision that is not one of :data:`BENCH_DTYPE_NAMES`, naming the parameter ``dtype``."""
    if dtype not in BENCH_DTYPE_NAMES:
        raise ValueError(f"`dtype` got {dtype!r}; allowed: {' | '.join(BENCH_DTYPE_NAMES)}")


@dataclass
class BenchSettings:
    """What ``ddl bench`` measures; each field's metadata holds the help of its flag (``--field-name``)."""

    preset: str = setting("tiny", "model size", choices=tuple(PRESETS))
    variants: Sequence[str] = setting(DEFAULT_VARIANTS)  # the text of --variants everywhere (cli/options.py)
    device: str = setting("auto")
    dtype: str = setting("float32", choices=BENCH_DTYPE_NAMES)  # bfloat16 / float16: autocast over fp32 weights
    batch_size: int | None = setting(None, f"sequences per batch (none: the preset's; batch x tokens: "
                                     f"{_SHAPES})", metavar="B")
    seq_len: int | None = setting(None, "tokens per sequence (none: the preset's, see --batch-size; at most the model's "
                                  "context)", metavar="T")
    steps: int = setting(2, "timed train steps per repeat", metavar="N")
    repeats: int = setting(5, "interleaved repeats; the median is reported", metavar="R")
    warmup: int = setting(1, "untimed warm-up rounds per variant (at least 1 with --compile: the first rounds "
                          "compile)", metavar="W")
    decode_tokens: int = setting(32, "decode steps timed per repeat; 0: no decode column", metavar="N")
    seed: int = setting(0, "seed of the models' initialisation and of the batches", metavar="S")
    model: dict = setting(help="DDLConfig fields set for every variant (--set model.FIELD=VALUE)", factory=dict)
    compile: bool = setting(False, "compile each block for the training step, as `ddl train --set compile=true`, "
                            "and decode with the fixed-shape cache and one compiled step (CUDA graphs on CUDA; "
                            "deep_delta.hf.StaticDecoder); prefill stays eager")
    cuda_graphs: str = setting("off", "with --compile on CUDA, the training step's forward and backward replayed as "
                               "CUDA graphs, as `ddl train --set cuda_graphs=...`: blocks or model (docs/training.md, "
                               "'CUDA graphs')", choices=CUDA_GRAPHS)

    def __post_init__(self):
        check_fields(self)

    def resolved(self) -> BenchSettings:
        """A copy with the device, batch size and sequence length filled in; ``ValueError`` naming the field
        for anything out of range."""
        from deep_delta.runtime import resolve_device

        variants = check_variants(self.variants, self.preset, self.model)
        check_dtype(self.dtype)
        device = str(resolve_device(self.device))
        b, t = DEFAULT_SHAPES.get(self.preset, (8, 1024))
        b = self.batch_size if self.batch_size is not None else b  # 0 is refused, not the default
        ctx = self.model.get("max_position_embeddings", PRESETS[self.preset]["max_position_embeddings"])
        t = self.seq_len if self.seq_len is not None else min(t, ctx)
        for name, value, lo in (("batch_size", b, 1), ("seq_len", t, 2), ("steps", self.steps, 1),
                                ("repeats", self.repeats, 1), ("warmup", self.warmup, 0),
                                ("decode_tokens", self.decode_tokens, 0)):
            check_count(name, value, lo)
        if t > ctx:
            raise ValueError(f"`seq_len` got {t}; allowed: 2..{ctx} (the preset's context)")
        if self.decode_tokens >= t:
            raise ValueError(f"`decode_tokens` got {self.decode_tokens}; allowed: 0..{t - 1} (below `seq_len`; 0: no "
                             "decode)")
        if not isinstance(self.compile, bool):
            raise ValueError(f"`compile` got {self.compile!r}; allowed: true | false")
        check_warmup(self.warmup, self.compile)
        if self.cuda_graphs not in CUDA_GRAPHS or (self.cuda_graphs != "off" and not self.compile):
            raise ValueError(f"`cuda_graphs` got {self.cuda_graphs!r}; allowed: {' | '.join(CUDA_GRAPHS)}, and other "
                             "than off only with --compile")
        return BenchSettings(self.preset, variants, device, self.dtype, b, t, self.steps, self.repeats,
                             self.warmup, self.decode_tokens, self.seed, dict(self.model), self.compile,
                             self.cuda_graphs)


def with_assignments(settings, assignments: Sequence[str]):
    """``settings`` (a :class:`BenchSettings` or ``KernelBenchSettings``) with ``KEY=VALUE`` ``assignments``
    applied (YAML values, :func:`deep_delta.settings.parse_assignments`): ``model.FIELD`` joins the
    ``model`` (DDLConfig fields) of every variant, any other key sets that field of ``settings``."""
    values = parse_assignments(list(assignments))
    model = values.pop("model", {})
    allowed = [f.name for f in fields(settings) if f.name != "model"]
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        raise ValueError(f"`assignments`: unknown setting(s) {unknown}; allowed: model.FIELD (a DDLConfig field), "
                         f"{', '.join(allowed)}")
    return replace(settings, **values, model={**settings.model, **model})


@dataclass
class KernelBenchSettings:
    """What ``ddl bench-kernels`` measures; each field's metadata holds the help of its flag (``--field-name``)."""

    preset: str = setting("tiny", "model size", choices=tuple(PRESETS))
    variants: Sequence[str] = setting(DEFAULT_VARIANTS, "; the step table's, the baseline added first when "
                                      "missing")
    device: str = setting("auto")
    dtype: str = setting("float32", choices=BENCH_DTYPE_NAMES)  # bfloat16 / float16: autocast over fp32 weights
    batch_size: int = setting(4, "sequences per step", metavar="B")
    seq_len: int = setting(256, "tokens per sequence", metavar="T")
    repeats: int = setting(7, "timed rounds", metavar="R")
    warmup: int = setting(2, "untimed rounds first (at least 1 when compiling)", metavar="W")
    compile: bool | None = setting(None, "also time torch.compile of the reference ops (none: on CUDA only)")
    skip_ops: bool = setting(False, "only the training-step table: no op table")
    skip_steps: bool = setting(False, "only the op table: no training-step table")
    seed: int = setting(0, "seed of the step table's models and batches", metavar="S")
    model: dict = setting(help="DDLConfig fields set for the step table's models (--set model.FIELD=VALUE)",
                          factory=dict)

    def __post_init__(self):
        check_fields(self)

    def resolved(self) -> KernelBenchSettings:
        """A copy with the device resolved, ``compile`` decided and the baseline among the variants;
        ``ValueError`` naming the field for anything out of range."""
        from deep_delta.runtime import resolve_device

        variants = list(self.variants)
        if "baseline" not in variants:
            variants.insert(0, "baseline")
        overrides = {"max_position_embeddings": self.seq_len, **self.model}
        check_count("batch_size", self.batch_size, 1)
        check_count("seq_len", self.seq_len, 1)
        check_count("repeats", self.repeats, 1)
        check_count("warmup", self.warmup, 0)
        variants = check_variants(variants, self.preset, overrides)
        check_dtype(self.dtype)
        device = resolve_device(self.device)
        compile_ = self.compile if self.compile is not None else device.type == "cuda"
        check_warmup(self.warmup, bool(compile_))
        return replace(self, variants=variants, device=str(device), compile=bool(compile_),
                       model=dict(self.model))


def check_variants(variants, preset: str, overrides: dict | None = None) -> list[str]:
    """The variant names as a list, checked (known, no repeats) with ``preset`` and ``overrides``: a bad
    preset or override fails here, before any model is built."""
    from deep_delta.models.ddl.configuration_ddl import DDLConfig
    from deep_delta.variants import PRESETS, VARIANTS

    if preset not in PRESETS:
        raise ValueError(f"`preset` got {preset!r}; allowed: {' | '.join(PRESETS)}")
    names = list(variants)
    if not names:
        raise ValueError("`variants` got no variant names")
    for v in names:
        if v not in VARIANTS:
            raise ValueError(f"`variants` got {v!r}; allowed: {' | '.join(VARIANTS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"`variants` got a variant twice in {','.join(names)}")
    for v in names:
        DDLConfig.from_variant(v, preset, **(overrides or {}))
    return names
