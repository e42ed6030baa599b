"""``ddl bench-kernels``: time the DDL ops and whole training steps, as ratios, in one run.

Two tables:
1. ops (forward + backward) at the preset's shape: the plain reference (naive), the lean PyTorch path
   (``backend="torch"``), ``torch.compile`` of the reference, and the Triton kernel (CUDA only; on CPU
   the kernels run only in the interpreter, which is not a speed measurement, so they are skipped
   with a note). Ratios are against the plain reference.
2. training step (forward + backward + AdamW) of each variant against the baseline, variants
   interleaved round-robin, median of ``--repeats`` rounds.
"""

from __future__ import annotations

import argparse

DEFAULT_VARIANTS = "baseline,ddl-dv1,ddl-cc,ddl-tc"


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bench-kernels",
        help="time DDL kernels vs the PyTorch reference and each variant's training step vs the baseline",
        description="Times each DDL op (delta update, CC/TC read, EC expansion; forward+backward) for the "
        "plain reference, the lean PyTorch path, torch.compile of the reference and the Triton kernel, and "
        "the training step (fwd+bwd+AdamW) of each variant against the baseline. Variants are interleaved "
        "round-robin; each figure is the median over --repeats rounds.",
    )
    p.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="state/compute dtype")
    p.add_argument("--preset", default="tiny", help="model preset: tiny | small | medium (default: tiny)")
    p.add_argument("--batch", type=int, default=4, help="sequences per step (default: 4)")
    p.add_argument("--seq", type=int, default=256, help="tokens per sequence (default: 256)")
    p.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"comma list (default: {DEFAULT_VARIANTS})")
    p.add_argument("--repeats", type=int, default=7, help="timed rounds (default: 7)")
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds first (default: 2)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--compile", dest="compile", action="store_true", default=None,
                   help="also time torch.compile of the reference ops (default: on CUDA only)")
    p.add_argument("--no-compile", dest="compile", action="store_false", help="skip torch.compile")
    p.add_argument("--skip-ops", action="store_true", help="only the training-step table")
    p.add_argument("--skip-steps", action="store_true", help="only the op table")
    p.add_argument("--out", default=None, help="also write the tables as markdown to this file")
    p.set_defaults(func=run)


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def _timer(device):
    import time

    import torch

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def timed(fn) -> float:
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        return time.perf_counter() - t0

    return timed


def _interleaved(cases: dict, repeats: int, warmup: int, timed) -> dict[str, float]:
    """Round-robin over cases; returns the median seconds of each."""
    for _ in range(warmup):
        for fn in cases.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            times[name].append(timed(fn))
    return {name: _median(ts) for name, ts in times.items()}


def _op_cases(cfg, batch: int, seq: int, dtype, device):
    """{op: {impl: callable doing fwd+bwd}} at the preset shape (impl None = not available)."""
    import torch

    from deep_delta.ops.compress.lean import channel_compress_lean, embed_conv_lean, token_compress_lean
    from deep_delta.ops.compress.naive import channel_compress_naive, embed_conv_naive, token_compress_naive
    from deep_delta.ops.delta.lean import delta_update_lean
    from deep_delta.ops.delta.naive import delta_update_torch

    d, dv, kk = cfg.hidden_size, 4, 4
    g = torch.Generator(device="cpu").manual_seed(0)

    def rnd(*shape, dt=dtype):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dt).requires_grad_()

    x, k = rnd(batch, seq, d, dv), rnd(batch, seq, d)
    v, beta = rnd(batch, seq, dv, dt=torch.float32), rnd(batch, seq, 1, dt=torch.float32)
    e, c, w = rnd(batch, seq, d), rnd(d, dv, dt=torch.float32), rnd(kk, d, dv, dt=torch.float32)
    gx = torch.randn(batch, seq, d, dv, generator=g).to(device=device, dtype=dtype)
    gin = torch.randn(batch, seq, d, generator=g).to(device=device, dtype=dtype)

    def fb(fn, args, grad):
        def call():
            out = fn(*args)
            torch.autograd.backward(out, grad)

        return call

    ops = {
        "delta update": (delta_update_torch, delta_update_lean, "delta_update", (x, k, v, beta), gx),
        "CC read": (channel_compress_naive, channel_compress_lean, "channel_compress", (x, c), gin),
        "TC read": (token_compress_naive, token_compress_lean, "token_compress", (x, w), gin),
        "EC expand": (embed_conv_naive, embed_conv_lean, "embed_conv", (e, w), gx),
    }
    return ops, fb


def _triton_fn(name: str):
    if name == "delta_update":
        from deep_delta.ops.delta.triton import delta_update_triton

        return lambda x, k, v, b: delta_update_triton(x, k, v, b)
    from deep_delta.ops.compress import triton as ct

    return getattr(ct, f"{name}_triton")


def _bench_ops(args, cfg, dtype, device, timed) -> list[str]:
    import torch

    ops, fb = _op_cases(cfg, args.batch, args.seq, dtype, device)
    use_compile = args.compile if args.compile is not None else device.type == "cuda"
    lines = [
        f"### Ops, forward + backward ({args.batch} x {args.seq} tokens, d={cfg.hidden_size}, d_v=4, "
        f"{args.dtype}, {device.type}): median ms, ratio vs the plain reference",
        "",
        "| op | reference ms | lean torch ms (speed-up) | compiled ref ms (speed-up) | triton ms (speed-up) |",
        "| --- | --- | --- | --- | --- |",
    ]
    notes = []
    for op, (naive, lean, tname, inputs, grad) in ops.items():
        cases = {"ref": fb(naive, inputs, grad), "lean": fb(lean, inputs, grad)}
        if use_compile:
            try:
                compiled = torch.compile(naive)
                fb(compiled, inputs, grad)()
                cases["compiled"] = fb(compiled, inputs, grad)
            except Exception as err:  # pragma: no cover - depends on the toolchain
                notes.append(f"torch.compile of {op} failed: {type(err).__name__}: {err}")
        if device.type == "cuda":
            cases["triton"] = fb(_triton_fn(tname), inputs, grad)
        t = _interleaved(cases, args.repeats, args.warmup, timed)
        ref = t["ref"]

        def cell(key, t=t, ref=ref):
            return f"{t[key] * 1e3:.2f} ({ref / t[key]:.2f}x)" if key in t else "n/a"

        lines.append(f"| {op} | {ref * 1e3:.2f} | {cell('lean')} | {cell('compiled')} | {cell('triton')} |")
    if device.type != "cuda":
        notes.append("Triton kernels: skipped, no GPU (on CPU they only run in the Triton interpreter, which is "
                     "a correctness check, not a speed measurement).")
    if not use_compile:
        notes.append("torch.compile: skipped (default off on CPU: the inductor C++ build takes minutes; --compile).")
    return lines + [""] + [f"- {n}" for n in notes]


def saved_activation_bytes(model, ids, tgt) -> int:
    """Bytes of the tensors autograd keeps for backward in one training forward (storage-deduplicated,
    parameters excluded), measured with saved-tensor hooks; with ``model.model.recompute_states`` the
    handles of the state tape count their frontier state and small rebuild tensors. Runs the backward.
    """
    import torch

    from deep_delta.ops.delta.recompute import kept_tensors, observe

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: list = []
    with observe(kept), torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        loss = model(ids, shift_labels=tgt).loss
    storages = {}
    for obj in kept:
        for t in kept_tensors(obj):
            st = t.untyped_storage()
            if st.data_ptr() not in params:
                storages[st.data_ptr()] = st.nbytes()
    loss.backward()
    model.zero_grad(set_to_none=True)
    return sum(storages.values())


def _bench_steps(args, dtype, device, timed) -> list[str]:
    import torch

    from deep_delta.models import DDLConfig, DDLForCausalLM

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if "baseline" not in variants:
        variants.insert(0, "baseline")
    models = {}
    for name in variants:
        cfg = DDLConfig.from_variant(name, args.preset, max_position_embeddings=max(args.seq, 1))
        torch.manual_seed(0)
        model = DDLForCausalLM(cfg).to(device=device, dtype=dtype).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        models[name] = (model, opt)
    vocab = models["baseline"][0].config.vocab_size
    g = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, vocab, (args.batch, args.seq), generator=g).to(device)
    tgt = torch.randint(0, vocab, (args.batch, args.seq), generator=g).to(device)

    def step_fn(model, opt):
        def step():
            loss = model(ids, shift_labels=tgt).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return step

    cases = {name: step_fn(*mo) for name, mo in models.items()}
    t = _interleaved(cases, args.repeats, args.warmup, timed)
    tokens = args.batch * args.seq
    base = t["baseline"]
    lines = [
        f"### Training step (fwd + bwd + AdamW), preset {args.preset}, {args.batch} x {args.seq} tokens, "
        f"{args.dtype}, {device.type}, delta_backend auto: median of {args.repeats} interleaved rounds",
        "",
        "| variant | ms / step | tokens/s | step time vs baseline | throughput vs baseline "
        "| saved activations MiB, x baseline | with recompute_states |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    saved = {}
    for name, (model, _) in models.items():
        for rec in (False, True):
            model.model.recompute_states = rec
            saved[name, rec] = saved_activation_bytes(model, ids, tgt)
        model.model.recompute_states = False
    sb = saved["baseline", False]
    for name in variants:
        mem = " | ".join(f"{saved[name, r] / 2**20:.1f} ({saved[name, r] / sb:.3f}x)" for r in (False, True))
        lines.append(
            f"| {name} | {t[name] * 1e3:.1f} | {tokens / t[name]:,.0f} | {t[name] / base:.3f}x | {base / t[name]:.3f}x "
            f"| {mem} |"
        )
    lines += ["", "Saved activations: bytes autograd keeps for backward after one forward (saved-tensor hooks, "
              "storages deduplicated, parameters excluded); recompute_states keeps only the last DDL state and "
              "rebuilds the others in backward (ops/delta/recompute.py)."]
    if device.type == "cuda":
        lines.append("")
        for name in models:
            torch.cuda.reset_peak_memory_stats(device)
            cases[name]()
            peak = torch.cuda.max_memory_allocated(device)
            lines.append(f"- peak memory {name}: {peak / 2**30:.3f} GiB")
    return lines


def run(args: argparse.Namespace) -> int:
    import platform

    import torch

    from deep_delta.cli.main import UsageError
    from deep_delta.models.ddl.configuration_ddl import PRESETS, DDLConfig

    if args.preset not in PRESETS:
        raise UsageError(f"--preset got {args.preset!r}; allowed: {' | '.join(PRESETS)}")
    for flag in ("repeats", "batch", "seq"):
        if getattr(args, flag) < 1:
            raise UsageError(f"--{flag} must be >= 1, got {getattr(args, flag)}")
    if args.warmup < 0:
        raise UsageError(f"--warmup must be >= 0, got {args.warmup}")
    try:
        device = torch.device(args.device)
    except RuntimeError as err:
        raise UsageError(f"--device got {args.device!r}: {err}") from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device got {args.device!r} but CUDA is not available here")
    if args.threads is not None:
        if args.threads < 1:
            raise UsageError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    timed = _timer(device)
    what = torch.cuda.get_device_name(device) if device.type == "cuda" else (
        f"CPU ({platform.processor() or platform.machine()}), {torch.get_num_threads()} threads")
    out = [f"## ddl bench-kernels on {what}, torch {torch.__version__}", ""]
    if not args.skip_ops:
        cfg = DDLConfig.from_variant("ddl-cc", args.preset)
        out += _bench_ops(args, cfg, dtype, device, timed) + [""]
    if not args.skip_steps:
        out += _bench_steps(args, dtype, device, timed) + [""]
    text = "\n".join(out)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0
