"""Memory traffic of the DDL kernels in one training step, from their launch arguments (``ddl bench-kernels
--traffic``).

The model runs one forward and backward on CPU with ``delta_backend="triton"`` inside
:class:`deep_delta.ops.launch.count_traffic` (dry: nothing is launched) and a ``FakeTensorMode`` (no tensor
has storage: the GEMMs and attention are not computed either, nothing of the step's size is allocated, so a
realistic step, e.g. 8 x 1024 tokens at the small preset, is counted in seconds), so every DDL kernel launch of the step
(delta update, fused update + CC read, CC / TC reads, EC, the sublayer's fused norm, gate and value
(``norm_gate_value``, k-Map with the linear gate), and the torch sums of their partial buffers) is
recorded with the bytes of its tensor arguments; any machine gives the same table, no GPU needed. What is
counted and what is not: :mod:`deep_delta.ops.launch`.

The ideal (issue 24): an ideally fused update moves ``2S + 4d`` bytes per token forward and ``3S + 6d``
backward per sublayer, ``S = d * d_v * bytes`` the state of one token (``4d`` and ``6d`` as the issue writes
them, in bytes), over the 2L sublayers.

What is counted follows the switches (:mod:`deep_delta.ops.switches`), which the table's heading states: the
write-only and untied rules' updates are kernels only with ``FUSED_RULES`` on; off, they run in torch, and their
rows say so ("not a kernel", the ratios to the ideal n/a) instead of counting nothing as zero bytes.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch

from deep_delta.ops.launch import NORM_SHARE, Launch, count_traffic

NORM_KERNELS = ("norm_gate_value_fwd_kernel", "norm_gate_value_bwd_kernel")  # deep_delta.ops.norm
UPDATE_KERNELS = ("delta_", "update_")  # the update's kernels (ops/delta): delta_*_kernel, update_*norm_*_kernel


@dataclass
class StepTraffic:
    variant: str
    tokens: int
    hidden_size: int
    value_channels: int
    sublayers: int
    state_bytes: int  # S: one token's state, d * d_v * element size
    launches: list[Launch]

    def per_token(self) -> dict[tuple[str, str], tuple[int, float, float]]:
        """(phase, kernel) -> (launches, read bytes per token, write bytes per token), in launch order."""
        rows: dict[tuple[str, str], list] = defaultdict(lambda: [0, 0, 0])
        for la in self.launches:
            row = rows[(la.phase, la.kernel)]
            row[0] += 1
            row[1] += la.read_bytes
            row[2] += la.write_bytes
        return {key: (n, r / self.tokens, w / self.tokens) for key, (n, r, w) in rows.items()}

    def total(self, phase: str, norm: bool | None = None) -> float:
        """Bytes per token of the recorded launches of ``phase`` ("forward" or "backward"): every launch
        (``norm=None``), only the sublayers' norm, gate and value (``True``: the ``norm_gate_value`` kernels and the
        sums of their partials) or all but those (``False``: the state kernels, what the issue's ideal is for)."""
        owner, total = "", 0
        for la in self.launches:
            if la.kernel != "partial_sum":  # a partial sum belongs to the kernel launched before it
                owner = la.kernel
            if la.phase == phase and (norm is None or (owner in NORM_KERNELS or owner.endswith(NORM_SHARE)) == norm):
                total += la.read_bytes + la.write_bytes
        return total / self.tokens

    def update_in_kernels(self) -> bool:
        """Whether the step's updates ran as kernels (a write-only or untied update with the ``fused_rules`` switch
        off runs in torch: nothing of it is counted)."""
        return any(la.kernel.startswith(UPDATE_KERNELS) for la in self.launches)

    def ideal(self, phase: str) -> float:
        """The issue's ideal per token: ``2S + 4d`` forward, ``3S + 6d`` backward, per sublayer."""
        s, d = self.state_bytes, self.hidden_size
        return self.sublayers * ((2 * s + 4 * d) if phase == "forward" else (3 * s + 6 * d))

    def step_ratio(self) -> float:
        """The whole step's state-kernel bytes (forward + backward, the norm's excluded) over the ideal's: the
        issue's "step traffic within 1.5x of the ideal"."""
        return ((self.total("forward", norm=False) + self.total("backward", norm=False))
                / (self.ideal("forward") + self.ideal("backward")))


def step_traffic(variant: str, preset: str = "small", batch_size: int = 8, seq_len: int = 1024,
                 dtype: str = "float32", **overrides) -> StepTraffic:
    """One training step of ``variant`` (a DDL delta variant) at ``preset`` on CPU, fp32 weights, under the
    autocast training uses for ``dtype`` ("float32", "bfloat16", "float16"; as ``ddl bench-kernels``), so the
    kernels get the tensors they get in training on a GPU: a d_v > 1 state stored in ``dtype`` (what
    ``state_dtype="auto"`` gives under CUDA autocast; an explicit ``state_dtype`` in ``overrides`` is kept), a
    d_v = 1 state in fp32. The ideal's S is for a state in ``dtype``.

    Per-token figures do not depend on ``batch_size * seq_len``, except the partial buffers of the weight
    gradients: one (d, d_v) fp32 tile per program of a persistent grid of at most ``max_programs`` programs
    (``MAX_PROGRAMS`` = 256 when counting; 2 x the SM count on CUDA), so their bytes per token fall as the
    token count grows; the table states the count. The step runs on fake tensors (no storage, nothing computed).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    from deep_delta.eval.launches import gpu_path_config
    from deep_delta.eval.settings import check_dtype
    from deep_delta.eval.timing import BENCH_DTYPES, autocast_for
    from deep_delta.models.ddl.modeling_ddl import DDLForCausalLM

    check_dtype(dtype)
    # the Triton path and the state dtype "auto" gives under CUDA autocast (on CPU, "auto" keeps fp32)
    cfg = gpu_path_config(variant, preset, dtype, **{"max_position_embeddings": seq_len, **overrides})
    if not cfg.design.fused_kernels(cfg):
        raise ValueError(f"step_traffic: `variant` must be a DDL delta variant (its kernels are counted), got "
                         f"{variant!r}")
    with FakeTensorMode(), count_traffic(dry=True) as counter:
        model = DDLForCausalLM(cfg).train()
        ids = torch.zeros(batch_size, seq_len, dtype=torch.long)
        counter.phase = "forward"
        with autocast_for(dtype, torch.device("cpu")):
            loss = model(ids, labels=ids).loss
        counter.phase = "backward"  # the backward of every weight, as a training step's
        torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad], allow_unused=True)
    d, dv = cfg.hidden_size, cfg.value_channels
    size = torch.empty((), dtype=BENCH_DTYPES[dtype] or torch.float32).element_size()
    return StepTraffic(variant, batch_size * seq_len, d, dv, 2 * cfg.num_hidden_layers, d * dv * size,
                       counter.launches)


def traffic_markdown(results: list[StepTraffic], preset: str, dtype: str) -> str:
    """The per-kernel table of every variant and the step totals next to the ideal."""
    from deep_delta.eval.timing import dtype_label
    from deep_delta.ops import switches
    from deep_delta.ops.launch import MAX_PROGRAMS

    state = ", ".join(f"{name} {'on' if on else 'off'}" for name, on in switches.current().items())
    out = [f"### DDL kernel traffic per token, one training step (preset {preset}, {dtype_label(dtype)}; from "
           f"launch arguments, not measured; switches: {state})", "",
           "| variant | phase | kernel | launches | read B/token | write B/token |", "| --- | --- | --- | --- | --- | --- |"]
    for res in results:
        for (phase, kernel), (n, r, w) in res.per_token().items():
            out.append(f"| {res.variant} | {phase} | {kernel} | {n} | {r:,.0f} | {w:,.0f} |")
    out += ["", "| variant | d | d_v | S bytes | sublayers | forward B/token | ideal 2S+4d | x ideal | "
            "backward B/token | ideal 3S+6d | x ideal | step x ideal | norm + gate + value fwd / bwd B/token | "
            "all DDL kernels fwd / bwd B/token |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for res in results:
        f, b = res.total("forward", norm=False), res.total("backward", norm=False)
        fi, bi = res.ideal("forward"), res.ideal("backward")
        nf, nb = res.total("forward", norm=True), res.total("backward", norm=True)
        if res.update_in_kernels():
            state = (f"{f:,.0f} | {fi:,.0f} | {f / fi:.2f} | {b:,.0f} | {bi:,.0f} | {b / bi:.2f} | "
                     f"{res.step_ratio():.2f}")
        else:  # the update ran in torch: its bytes are not counted, so no ratio to the ideal
            state = f"not a kernel | {fi:,.0f} | n/a | not a kernel | {bi:,.0f} | n/a | n/a"
        out.append(f"| {res.variant} | {res.hidden_size} | {res.value_channels} | {res.state_bytes} | {res.sublayers} "
                   f"| {state} | {nf:,.0f} / {nb:,.0f} | {res.total('forward'):,.0f} / {res.total('backward'):,.0f} |")
    tokens = results[0].tokens if results else 0
    out += ["", f"Counted (dry launches on fake CPU tensors), not measured, at {tokens} tokens per step. The "
            "partial buffers of the weight gradients hold one fp32 copy of the weight ((d, d_v) tiles; the sublayer "
            "norm's g, w_g, b_g, W_v, b_v) per program of a persistent grid of "
            f"at most {MAX_PROGRAMS} programs per launch (the K taps of a TC / EC convolution share them; 2 x the "
            "SM count on a GPU, 264 on an H100), so their bytes per token fall as the step grows; the rest "
            "is per token. Each tensor argument once; "
            "compressor and norm weights once per launch (L2-resident); the sublayer's norm, gate and value "
            "(norm_gate_value, k-Map with the linear gate) are counted in their own column, not in the totals "
            "against the ideal (issue 24's, per sublayer, is the state update's); where a d_v = 1 update "
            "computes the next sublayer's norm, gate and value in the same launch (update_norm_*), the tensors only "
            f"that part moves are recorded apart ('{NORM_SHARE.strip()}') and counted in the norm's column; the "
            "last column is every DDL kernel of the step; the HC / mHC kernels and the other "
            "non-DDL work (GEMMs, the final and QK norms, attention) are not counted. Step x ideal: forward + backward "
            "over the two ideals' sum. 'not a kernel': the variant's update ran in torch (the write-only and untied "
            "rules with FUSED_RULES off), so its bytes are not counted and have no ratio to the ideal."]
    return "\n".join(out)


def traffic_report(settings) -> str:
    """``ddl bench-kernels --traffic``: :func:`traffic_markdown` for the DDL delta variants among
    ``settings.variants`` (a resolved :class:`deep_delta.eval.kernel_bench.KernelBenchSettings`)."""
    from deep_delta.models.ddl.configuration_ddl import DDLConfig

    variants = [v for v in settings.variants if (c := DDLConfig.from_variant(v, settings.preset)).design.fused_kernels(c)]
    if not variants:
        raise ValueError(f"bench-kernels traffic: `variants` has no DDL delta variant, got {list(settings.variants)}")
    model_overrides = {k: v for k, v in settings.model.items() if k != "delta_backend"}
    results = [step_traffic(v, settings.preset, settings.batch_size, settings.seq_len, settings.dtype,
                            **model_overrides) for v in variants]
    return traffic_markdown(results, settings.preset, settings.dtype)
