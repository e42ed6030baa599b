"""The DDL Transformer: one Llama-style decoder for the additive baseline and every DDL variant.

Each sublayer F (attention, then the MLP) changes the residual state X through its residual:

    baseline (additive):  X <- X + F(RMSNorm(X))
    DDL:                  X <- X + beta k (v^T - k^T X)
                          k = F(c) / |F(c)|,  c = RMSNorm(read(X)),  beta = beta_max sigmoid(w^T c + b) in (0, 2)

X is (d,) per token for d_v = 1 and (d, d_v) for d_v > 1 (DDL-CC, DDL-TC). There the embedding is expanded to
d_v channels at the input (repeated, or EC: a short convolution along the tokens), each block reads X back to
(d,) with its compressor (CC: a mix of the channels; TC: a convolution along the tokens), shared by its two
sublayers, and a final compressor reads the last state. HC / mHC (the rivals) keep n streams instead.

The backbone is the same for every variant: pre-norm RMSNorm, RoPE multi-head attention with RMSNorm on q and
k (after RoPE, as the authors' model does), SwiGLU MLP, no biases, tied embeddings, final RMSNorm.

Reading order: the sublayers (RoPE, attention, MLP); the residual around each and the block; initialisation and
muP; the model; the LM. The generation caches (attention K/V plus the token history of the convolutions) and the
names transformers gives the cache argument live in cache.py.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache, GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from deep_delta.designs.base import NOTHING, BlockPlan, Carry, mup_readout_init_, unfused
from deep_delta.models.ddl.cache import (
    CACHE_FIELD,
    CACHE_NAMES,
    DDLCache,
    DDLStaticCache,
    cache_to_fill,
    one_cache,
    output_cache,
    refuse_unknown_kwargs,
)
from deep_delta.models.ddl.configuration_ddl import DDLConfig
from deep_delta.ops.delta.recompute import StateTape


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RotaryEmbedding(nn.Module):
    """RoPE tables for given positions: position_ids (B, T) -> cos, sin (B, 1, T, head_dim)."""

    def __init__(self, head_dim: int, base: float):
        super().__init__()
        self.head_dim, self.base = head_dim, base
        self.register_buffer("inv_freq", self.compute_inv_freq(), persistent=False)

    def compute_inv_freq(self) -> torch.Tensor:
        return 1.0 / (self.base ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim))

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype):
        freqs = position_ids[..., None].float() * self.inv_freq.to(position_ids.device)
        emb = torch.cat((freqs, freqs), dim=-1).unsqueeze(1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


class Attention(nn.Module):
    """Causal multi-head attention with RoPE and QK RMSNorm; K/V go through the cache when given."""

    def __init__(self, config: DDLConfig, layer_idx: int):
        super().__init__()
        d, self.n_heads, self.head_dim = config.hidden_size, config.num_attention_heads, config.head_dim
        self.layer_idx = layer_idx
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        self.q_norm = nn.RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = nn.RMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def reset_parameters(self, std: float, out_std: float) -> None:
        """q, k, v ~ N(0, std^2); the output projection ~ N(0, out_std^2). (The QK norms are RMSNorms.)"""
        for lin in (self.q_proj, self.k_proj, self.v_proj):
            init.normal_(lin.weight, mean=0.0, std=std)
        init.normal_(self.o_proj.weight, mean=0.0, std=out_std)

    def forward(self, c: torch.Tensor, rope, cache: DynamicCache | None, mask: torch.Tensor | None):
        b, t, d = c.shape
        q = self.q_proj(c).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(c).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(c).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        cos, sin = rope
        q = self.q_norm(q * cos + rotate_half(q) * sin)
        k = self.k_norm(k * cos + rotate_half(k) * sin)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        if mask is None and k.shape[2] == t:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # decoding (t == 1, no mask needed) or an explicit causal/padding mask
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, d))


class SwiGLU(nn.Module):
    def __init__(self, config: DDLConfig):
        super().__init__()
        d, h = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(d, h, bias=False)
        self.up_proj = nn.Linear(d, h, bias=False)
        self.down_proj = nn.Linear(h, d, bias=False)

    def reset_parameters(self, std: float, out_std: float) -> None:
        """gate and up ~ N(0, std^2); the output (down) projection ~ N(0, out_std^2)."""
        init.normal_(self.gate_proj.weight, mean=0.0, std=std)
        init.normal_(self.up_proj.weight, mean=0.0, std=std)
        init.normal_(self.down_proj.weight, mean=0.0, std=out_std)

    def forward(self, c: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(c)) * self.up_proj(c))


class DDLBlock(GradientCheckpointingLayer):
    """One Transformer block: attention and MLP sublayers, each wrapped in a (delta) residual.

    Under ``model.activation_checkpointing_enable()`` (transformers' ``GradientCheckpointingLayer``) a block in
    training keeps only its inputs for backward and runs its forward again there; module hooks (FSDP2's) stay
    outside the recomputation. The tensors it differentiates are positional, as that mechanism asks.
    """

    def __init__(self, config: DDLConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.design = config.design  # the residual design (deep_delta.designs): the block asks it, never which it is
        self.attn = self.design.residual(config, Attention(config, layer_idx), 2 * layer_idx)
        self.mlp = self.design.residual(config, SwiGLU(config), 2 * layer_idx + 1)
        self.compressor = self.design.block_read(config)  # DDL's d_v > 1 state: its read back to (..., d)

    # False: this block's updates compute nothing for the sublayer after them (its reads and norms run as their
    # own calls; the same values), and the blocks beside it none for it (the delta design's fusion plan)
    fuse_reads: bool = True

    def forward(self, state, carry: Carry, rope, mask: torch.Tensor | None = None,
                pad_mask: torch.Tensor | None = None, *, cache: DDLCache | None = None,
                emits: BlockPlan = (NOTHING, NOTHING)):
        """The attention update, then the MLP update, each by the design (``design.sublayer``). Returns ``(new state,
        Carry)``: what the MLP update computed for the next sublayer (the next block's attention, or the readout).

        state: whatever the design carries ((B, T, d) for the baseline and d_v = 1, (B, T, d, d_v) for DDL's d_v > 1,
        (B, T, d, n) for HC, a tuple of (B, T, d) sources for AttnRes). carry: what the previous block's last update
        computed for this block's attention sublayer (:class:`Carry`; empty for the first). emits: what each of the
        two updates computes for the sublayer after it, from the design's plan. rope: (cos, sin); mask: the
        attention mask or None; pad_mask: (B, T) 1 at tokens, 0 at pads, or None.
        """
        attn_emit, mlp_emit = emits
        state, carry = self.design.sublayer(self, "attn", state, carry, attn_emit, (rope, cache, mask), pad_mask,
                                            cache)
        return self.design.sublayer(self, "mlp", state, carry, mlp_emit, (), pad_mask, cache)


class DDLPreTrainedModel(PreTrainedModel):
    config_class = DDLConfig
    config: DDLConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True  # per block: DDLBlock is a GradientCheckpointingLayer
    _no_split_modules = ["DDLBlock"]
    _supports_sdpa = True
    _skip_keys_device_placement = list(CACHE_NAMES)

    def lr_multipliers(self) -> dict[str, float]:
        """Adam learning-rate multiplier per parameter name: {} under "sp" (all 1).

        Under muP (m = ``config.mup_width_mult``): 1/m for every ``nn.Linear`` weight except the LM head,
        i.e. the hidden matrices (q, k, v, o, the MLP, phi_k, the MLP gate's hidden layer) and the scalar
        readouts (value and gate projections), whose fan-in grows with the width, and for the same reason the
        hyper-connections' dynamic projections and AttnRes's pseudo-queries (``design.mup_readouts``). Embeddings (tied readout: its 1/m is
        the logit multiplier), norms, biases, compressor and EC taps (per-feature) and the hyper-connections'
        static coefficients and scales (width-independent) keep 1 (a design names its readouts:
        ``design.mup_readouts``). ``deep_delta.train.optim.param_groups``
        reads this, so ``ddl train`` and a user's loop get the same groups.
        """
        cfg = self.config
        if cfg.parametrization != "mup":
            return {}
        head = self.get_output_embeddings() if hasattr(self, "lm_head") else None
        out = {}
        for name, module in self.named_modules():
            prefix = f"{name}." if name else ""
            if isinstance(module, nn.Linear) and module is not head:
                out[f"{prefix}weight"] = 1.0 / cfg.mup_width_mult
            else:
                out.update({f"{prefix}{p}": 1.0 / cfg.mup_width_mult for p in cfg.design.mup_readouts(module)})
        return out

    def muon_lr_multipliers(self) -> dict[str, float]:
        """The tensors Muon trains (``TrainConfig.optimizer="muon"``, ``deep_delta.train.optim``), each with its
        learning-rate multiplier.

        Muon trains the hidden matrices: the 2-D weights of the sublayers themselves, every :class:`Attention`'s
        (q, k, v, o) and :class:`SwiGLU`'s (gate, up, down), whose two dimensions both grow with the width. AdamW
        trains everything else: the embeddings and the LM head, norms, the residuals' own parameters (the gates,
        the value and key maps, compressor and EC taps, AttnRes's pseudo-queries, the hyper-connections'
        coefficients: readouts, per-feature or width-independent, not hidden matrices). Multiplier 1 under "sp";
        under muP 1 / sqrt(m) (m = ``config.mup_width_mult``): Muon's update, scaled to AdamW's RMS, has a
        spectral norm ~ lr 0.2 sqrt(max(A, B)) ~ lr sqrt(m), and the spectral condition asks for
        sqrt(fan_out / fan_in), constant for these matrices (docs/mup.md, "Muon").
        """
        cfg = self.config
        r = 1.0 / math.sqrt(cfg.mup_width_mult) if cfg.parametrization == "mup" else 1.0
        return {f"{name}.{p_name}": r for name, module in self.named_modules()
                if isinstance(module, (Attention, SwiGLU)) for p_name, p in module.named_parameters() if p.dim() == 2}

    def _initialize_weights(self, module: nn.Module, *args, **kwargs) -> None:
        """transformers' per-module step of ``initialize_weights`` without its branch for custom code.

        For a model defined outside transformers that branch skips every module without parameters of its
        own (marking it initialised): the gate, the residual, attention and the MLP, whose
        ``reset_parameters`` hold their init. It protects code that writes loaded weights in place; ours
        writes only through the guarded init functions, so every module gets ``_init_weights``.
        """
        if getattr(module, "_is_hf_initialized", False):
            return
        self._init_weights(module)
        module._is_hf_initialized = True

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """Every module that owns weights is initialised by its own ``reset_parameters``; this picks the std.

        Hidden weights ~ N(0, (hidden_init_scale / sqrt(d))^2), the attention and MLP output projections
        divided by sqrt(num_hidden_layers) more; embeddings and the LM head ~ N(0, initializer_range^2).
        transformers calls this once per module, children first (so the gate of a residual before its
        projections); a bare nn.Linear is always part of one of the modules below and is skipped here.
        Under ``initialize_weights`` the ``nn.init`` functions skip tensors loaded from a checkpoint, and so
        does ``identity_taps_``.
        """
        cfg = self.config
        std = cfg.hidden_init_scale / math.sqrt(cfg.hidden_size)
        if isinstance(module, (Attention, SwiGLU)):
            module.reset_parameters(std, std / math.sqrt(cfg.num_hidden_layers))
        elif cfg.design.init_module(module, cfg, std):  # the design's own modules (its gates, projections, ...)
            pass
        elif isinstance(module, nn.RMSNorm):
            module.reset_parameters()
        elif isinstance(module, nn.Embedding) or module is getattr(self, "lm_head", None):
            init.normal_(module.weight, mean=0.0, std=cfg.initializer_range)
            if module is getattr(self, "lm_head", None) and not cfg.tie_word_embeddings:
                mup_readout_init_(module.weight, cfg)  # an untied LM head is muP's readout (docs/mup.md)
        elif isinstance(module, RotaryEmbedding):
            init.copy_(module.inv_freq, module.compute_inv_freq())


def _attention_mask(attention_mask: torch.Tensor | None, t: int, past: int, device) -> torch.Tensor | None:
    """Boolean (B, 1, t, past + t) mask when needed; None when plain causal attention suffices.

    A given ``attention_mask`` is always applied, padded or not: telling the two apart would read a value on
    the host (a device synchronisation), and with no padding the mask equals the causal one.
    """
    padded = attention_mask is not None
    if not padded and (past == 0 or t == 1):
        return None
    s = past + t
    causal = torch.ones(t, s, dtype=torch.bool, device=device).tril(diagonal=past)
    mask = causal[None, None]
    if padded:
        mask = mask & attention_mask[:, None, None, -s:].bool()
        # a fully masked row (a pad query) would give NaN; let it attend to itself
        own = torch.arange(s, device=device)[None, :] == torch.arange(past, past + t, device=device)[:, None]
        mask = mask | own[None, None]
    return mask


class DDLModel(DDLPreTrainedModel):
    """The backbone: embeddings -> (embedding norm) -> the design's state -> blocks -> the design's readout -> RMSNorm.

    The residual design (``config.residual``; :mod:`deep_delta.designs`) makes the state, updates it around each
    sublayer and reads it out; the backbone only calls it. A delta update can compute what the sublayer after it
    takes (its read, or its norm, gate and value) in the same op: the delta design's fusion plan
    (:mod:`deep_delta.designs.delta.fusion`), made once per forward. ``fuse_reads = False``
    (an attribute, default True) keeps updates from computing anything for the next block (the blocks' own
    ``fuse_reads`` for their two sublayers); ``fuse_updates = False`` fuses nothing at all: same values, for hooks on
    every sublayer, tests and benchmarks. ``recompute_states`` (from the config, default False) saves only the last
    state of the delta chain for backward and rebuilds the earlier ones from it
    (:class:`deep_delta.ops.delta.recompute.StateTape`).
    """

    fuse_reads: bool = True
    fuse_updates: bool = True

    def __init__(self, config: DDLConfig):
        super().__init__(config)
        # True: keep only the last state for backward and rebuild the others from it (ops/delta/recompute.py):
        # far less activation memory, gradients differ by the rebuild's rounding. Refused in a compiled forward
        # of this module (compile the blocks instead; see _use_tape).
        self.recompute_states = config.recompute_states
        d = config.hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size, d)
        # the embedding norm (config.embed_norm): before the state expansion, the streams or the first source
        self.embed_norm = nn.RMSNorm(d, eps=config.rms_norm_eps) if config.embed_norm else None
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta)
        self.design = config.design  # the residual design (deep_delta.designs)
        # the first state from the (normed) embedding (DDL's d_v > 1 expansion, HC's streams, AttnRes's first source)
        self.expander = self.design.expander(config)
        self.layers = nn.ModuleList(DDLBlock(config, i) for i in range(config.num_hidden_layers))
        # the final readout of the state to (B, T, d): a compressor (d_v > 1), HC's stream readout or AttnRes's last
        # depth attention (its name is that of the weights in every saved checkpoint)
        self.final_compressor = self.design.readout(config)
        self.norm = nn.RMSNorm(d, eps=config.rms_norm_eps)
        self.post_init()

    def forward(self, input_ids: torch.LongTensor | None = None, attention_mask: torch.Tensor | None = None,
                position_ids: torch.LongTensor | None = None, cache: DDLCache | None = None,
                inputs_embeds: torch.Tensor | None = None, use_cache: bool | None = None,
                return_dict: bool | None = None, past_key_values: DDLCache | None = None,
                **kwargs) -> BaseModelOutputWithPast | tuple:
        """input_ids (B, T) or inputs_embeds (B, T, d) -> last_hidden_state (B, T, d) (and the cache).

        attention_mask (B, past + T): 1 at tokens, 0 at pads; when given it is always applied (no host read to
        find out whether anything is padded). cache: a :class:`DDLCache` (``past_key_values`` is the same
        argument under its name before transformers 5.24). Any other keyword is an error.
        """
        cache = one_cache("DDLModel.forward", cache, past_key_values, kwargs.pop("cache_params", None))
        refuse_unknown_kwargs("DDLModel.forward", kwargs)
        inputs_embeds = self._embed(input_ids, inputs_embeds)
        if self.embed_norm is not None:
            inputs_embeds = self.embed_norm(inputs_embeds)
        b, t = inputs_embeds.shape[:2]
        if use_cache is None:
            use_cache = self.config.use_cache and not self.training
        cache = cache_to_fill(cache, use_cache)
        if isinstance(cache, DDLStaticCache):
            # positions and mask from the written length on the device: no host read, the same graph each step
            if attention_mask is not None:
                raise ValueError("DDLModel: a DDLStaticCache serves unpadded batches; `attention_mask` must be None")
            if b != cache.batch_size:
                raise ValueError(f"DDLModel: the batch has {b} rows, the DDLStaticCache {cache.batch_size}")
            positions = cache.positions(t)
            mask = cache.attention_mask(positions)
        else:
            past = cache.get_seq_length() if cache is not None else 0
            if past + t > self.config.max_position_embeddings:
                raise ValueError(
                    f"DDLModel: {past + t} positions ({past} cached + {t} new) exceed "
                    f"max_position_embeddings={self.config.max_position_embeddings}"
                )
            positions = torch.arange(past, past + t, device=inputs_embeds.device)
            mask = _attention_mask(attention_mask, t, past, inputs_embeds.device)
        if position_ids is None:
            position_ids = positions.unsqueeze(0).expand(b, t)
        rope = self.rotary(position_ids, inputs_embeds.dtype)
        dtype = self.design.state_dtype(self.config, inputs_embeds)
        # 1 at real tokens, 0 at pads; applied whenever a mask is given (x * 1 is exact, and checking for
        # padding would be a host read)
        pad_mask = None if attention_mask is None else attention_mask[:, -t:].to(dtype)
        with StateTape() if self._use_tape() else contextlib.nullcontext() as tape:
            x = self._residual_stream(inputs_embeds.to(dtype), rope, mask, pad_mask, cache, tape)
        if isinstance(cache, DDLStaticCache):
            cache.advance(t)
        x = self.norm(x.to(inputs_embeds.dtype))
        out = BaseModelOutputWithPast(last_hidden_state=x, **{CACHE_FIELD: cache if use_cache else None})
        return out if return_dict is not False else out.to_tuple()

    def _embed(self, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None) -> torch.Tensor:
        """(B, T) token ids -> (B, T, d) embeddings, or the given ``inputs_embeds``."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("DDLModel: pass exactly one of `input_ids` (B, T) or `inputs_embeds` (B, T, d)")
        if inputs_embeds is not None:
            return inputs_embeds
        if input_ids.dim() != 2:
            raise ValueError(f"DDLModel: `input_ids` must have shape (B, T), got {tuple(input_ids.shape)}")
        vocab = self.config.vocab_size
        # off by default: two host reads, a device synchronisation per step (the embedding still refuses an id
        # out of range, with an IndexError on CPU and a device-side assert on CUDA)
        if self.config.validate_inputs and input_ids.numel():
            lo, hi = int(input_ids.min()), int(input_ids.max())
            if lo < 0 or hi >= vocab:
                raise ValueError(f"DDLModel: token ids must lie in [0, vocab_size={vocab}), got range [{lo}, {hi}]")
        return self.embed_tokens(input_ids)

    def _use_tape(self) -> bool:
        """recompute_states applies to a differentiated forward without checkpointed blocks (a checkpointed
        block keeps only its input and rebuilds its states by running again). Compiled blocks are fine (the
        custom ops record their updates when they run); a compiled ``DDLModel.forward`` is refused, since
        the tape's saved-tensor hooks cannot be traced (under ``fullgraph=True`` Dynamo reports this error;
        without it the forward falls back to eager with the tape and its blocks are compiled on their own)."""
        use = (
            self.recompute_states and self.design.records_states(self.config) and torch.is_grad_enabled()
            and not (self.training and any(block.gradient_checkpointing for block in self.layers))
        )
        if use and torch.compiler.is_compiling():
            raise RuntimeError(
                "DDLModel: `recompute_states` cannot run inside a compiled DDLModel.forward (the state rebuild's "
                "saved-tensor hooks are not traceable); compile the blocks instead (`block.compile()` for each "
                "block, as `ddl train --compile` does) or set `recompute_states=False`"
            )
        return use

    def _residual_stream(self, x: torch.Tensor, rope, mask: torch.Tensor | None, pad_mask: torch.Tensor | None,
                         cache: DDLCache | None, tape: StateTape | None) -> torch.Tensor:
        """Embeddings (B, T, d) -> the design's first state -> the blocks -> the design's readout: (B, T, d)."""
        design = self.design
        x = design.embed(self, x, pad_mask, cache)
        if tape is not None:
            tape.register(x)
        emits = design.plan(self, x, cache, pad_mask) if self.fuse_updates else unfused(len(self.layers))
        carry = Carry()
        for block, block_emits in zip(self.layers, emits):
            x, carry = block(x, carry, rope, mask, pad_mask, cache=cache, emits=block_emits)
        return design.read_out(self, x, carry, pad_mask, cache)


class DDLForCausalLM(DDLPreTrainedModel, GenerationMixin):
    """Causal LM over :class:`DDLModel`; ``model(input_ids, labels=...)`` returns ``.loss`` and ``.logits``.

    ``labels`` follow the Hugging Face convention (shifted inside; -100 is ignored); ``shift_labels`` are
    targets already aligned with the inputs (as a token-shard loader produces them).
    """

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: DDLConfig):
        super().__init__(config)
        self.model = DDLModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def forward(self, input_ids: torch.LongTensor | None = None, attention_mask: torch.Tensor | None = None,
                position_ids: torch.LongTensor | None = None, cache: DDLCache | None = None,
                inputs_embeds: torch.Tensor | None = None, labels: torch.LongTensor | None = None,
                shift_labels: torch.LongTensor | None = None, use_cache: bool | None = None, logits_to_keep: int = 0,
                return_dict: bool | None = None, num_items_in_batch: int | torch.Tensor | None = None,
                past_key_values: DDLCache | None = None, **kwargs) -> CausalLMOutputWithPast | tuple:
        """Logits (B, T, V) (the last ``logits_to_keep`` positions when > 0), the loss when labels are given, and
        the cache. ``num_items_in_batch`` (from transformers' Trainer under gradient accumulation) divides the
        summed token losses instead of their count. Any keyword not named here is an error."""
        cache = one_cache("DDLForCausalLM.forward", cache, past_key_values, kwargs.pop("cache_params", None))
        refuse_unknown_kwargs("DDLForCausalLM.forward", kwargs)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
                         inputs_embeds=inputs_embeds, use_cache=use_cache)
        h = out.last_hidden_state
        if logits_to_keep:
            h = h[:, -logits_to_keep:]
        if self.config.parametrization == "mup":  # muP readout multiplier 1/m, here on h (d <= vocab)
            h = h * (1.0 / self.config.mup_width_mult)
        logits = self.lm_head(h)
        loss = None
        if labels is not None or shift_labels is not None:
            if shift_labels is None:
                if labels.shape != h.shape[:2]:
                    raise ValueError(f"`labels` must have shape {tuple(h.shape[:2])}, got {tuple(labels.shape)}")
                shift_labels = F.pad(labels[:, 1:], (0, 1), value=-100)
            elif shift_labels.shape != h.shape[:2]:
                raise ValueError(f"`shift_labels` must have shape {tuple(h.shape[:2])}, got {tuple(shift_labels.shape)}")
            loss = F.cross_entropy(
                logits.float().view(-1, logits.shape[-1]), shift_labels.reshape(-1).to(logits.device), ignore_index=-100,
                reduction="mean" if num_items_in_batch is None else "sum",
            )
            if num_items_in_batch is not None:
                loss = loss / num_items_in_batch
        result = CausalLMOutputWithPast(loss=loss, logits=logits, **{CACHE_FIELD: output_cache(out)})
        return result if return_dict is not False else result.to_tuple()
