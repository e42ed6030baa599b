"""Text generation: greedy or sampled (temperature, top-k, top-p), with the cache; through ``model.generate()``,
or with ``compile`` through :class:`deep_delta.hf.decode.StaticDecoder` (fixed-shape cache, one compiled step)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class SamplingOptions:
    """greedy, or sampling with ``temperature`` (> 0), ``top_k`` (None/0 = off) and ``top_p`` (1.0 = off)."""

    max_new_tokens: int = 64
    greedy: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    use_cache: bool = True
    compile: bool = False  # StaticDecoder with a compiled step (prompts of one length) instead of generate()

    def check(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"`max_new_tokens` got {self.max_new_tokens}; allowed: an integer >= 1")
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ValueError(f"`temperature` got {self.temperature}; allowed: a float >= 0 (0 = greedy)")
        if self.top_k is not None and self.top_k < 0:
            raise ValueError(f"`top_k` got {self.top_k}; allowed: an integer >= 1 (0 or None = off)")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"`top_p` got {self.top_p}; allowed: a float in (0, 1]")
        if self.compile and not self.use_cache:
            raise ValueError("`compile` decodes with the fixed-shape cache; it cannot be combined with "
                             "`use_cache=False`")

    @property
    def sampled(self) -> bool:
        return not self.greedy and self.temperature > 0

    def pick(self, logits: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """The next token of each row from its logits (B, V): the argmax, or a draw after temperature, top-k and
        top-p (the smallest set of most likely tokens whose mass reaches top_p; at least one token)."""
        if not self.sampled:
            return logits.argmax(-1)
        scores = logits.float() / self.temperature
        if self.top_k:
            kth = scores.topk(min(self.top_k, scores.shape[-1]), dim=-1).values[:, -1:]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if self.top_p is not None and self.top_p < 1.0:
            ordered, order = scores.sort(dim=-1, descending=True)
            probs = ordered.softmax(-1)
            drop = probs.cumsum(-1) - probs >= self.top_p  # the mass before a token already reaches top_p
            scores = scores.scatter(-1, order, ordered.masked_fill(drop, float("-inf")))
        return torch.multinomial(scores.softmax(-1), 1, generator=generator).squeeze(-1)

    def generation_config(self, eos_token_id: int | None, pad_token_id: int | None, max_new_tokens: int):
        from transformers import GenerationConfig

        sample = self.sampled
        kwargs = dict(
            max_new_tokens=max_new_tokens,
            do_sample=sample,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            use_cache=self.use_cache,
        )
        if sample:
            kwargs.update(temperature=self.temperature, top_k=self.top_k or 0, top_p=self.top_p or 1.0)
        return GenerationConfig(**kwargs)


@dataclass
class Generation:
    prompt: str
    text: str  # the completion only
    prompt_tokens: int
    new_tokens: int


def _which(i: int, prompts: list[str]) -> str:
    return f"prompt {i + 1}" if len(prompts) > 1 else "the prompt"


def check_text(text: str, what: str) -> None:
    """Refuse a str that is not Unicode text: bytes that were not UTF-8 (Python keeps them as lone surrogates,
    U+DC80..U+DCFF, in ``sys.argv`` and in files read with ``errors="surrogateescape"``), or other lone
    surrogates. The ValueError names ``what`` and the position of the first bad byte (or character)."""
    try:
        text.encode("utf-8")
        return
    except UnicodeEncodeError as e:
        char = e.start
    try:
        raw = text.encode("utf-8", "surrogateescape")  # the bytes as they were given
        raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{what} is not valid UTF-8 text: byte {e.start} is 0x{raw[e.start]:02x} ({e.reason}); "
                         "give the text in UTF-8 (check the terminal's or the file's encoding)") from None
    except UnicodeEncodeError:
        pass
    raise ValueError(f"{what} is not valid UTF-8 text: character {char} is a lone surrogate "
                     f"(U+{ord(text[char]):04X}), which no UTF-8 text contains")


def check_prompts(prompts: list[str]) -> None:
    """:func:`check_text` for each prompt, named as ```prompts`: the prompt`` (or ```prompts`: prompt N``)."""
    for i, p in enumerate(prompts):
        check_text(p, f"`prompts`: {_which(i, prompts)}")


def encode_prompts(tokenizer, prompts: list[str], context: int) -> list[list[int]]:
    """Token ids of each prompt (an empty prompt starts from the end-of-text token).

    A prompt that is not UTF-8 text, or that leaves no room for a new token in the ``context``, is refused.
    """
    check_prompts(prompts)
    out = []
    for i, p in enumerate(prompts):
        ids = tokenizer.encode(p, add_special_tokens=False, verbose=False) if p else [tokenizer.eos_token_id]
        if len(ids) >= context:
            which = _which(i, prompts)
            raise ValueError(
                f"`prompts`: {which} is {len(ids)} tokens, but the model's context is {context} tokens "
                f"(max_position_embeddings), leaving no room to generate; shorten it to at most {context - 1} tokens"
            )
        out.append(ids)
    return out


@torch.no_grad()
def generate_text(model, tokenizer, prompts: list[str], options: SamplingOptions) -> tuple[list[Generation], int]:
    """Complete each prompt; a batch is left-padded. Returns the generations and the max_new_tokens used
    (``options.max_new_tokens``, cut so the longest prompt plus its completion fits the context)."""
    options.check()
    context = model.config.max_position_embeddings
    ids = encode_prompts(tokenizer, prompts, context)
    longest = max(len(x) for x in ids)
    max_new = min(options.max_new_tokens, context - longest)
    if options.compile:
        return _generate_static(model, tokenizer, prompts, ids, options, max_new), max_new
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    device = next(model.parameters()).device
    input_ids = torch.full((len(ids), longest), pad, dtype=torch.long)
    attention_mask = torch.zeros((len(ids), longest), dtype=torch.long)
    for row, x in enumerate(ids):
        input_ids[row, longest - len(x):] = torch.tensor(x)
        attention_mask[row, longest - len(x):] = 1
    if options.seed is not None:
        torch.manual_seed(options.seed)
    gen_cfg = options.generation_config(tokenizer.eos_token_id, pad, max_new)
    out = model.generate(
        input_ids=input_ids.to(device),
        attention_mask=attention_mask.to(device) if len(ids) > 1 else None,
        generation_config=gen_cfg,
    )
    return _results(tokenizer, prompts, ids, out[:, longest:].tolist()), max_new


def _results(tokenizer, prompts: list[str], ids: list[list[int]], new_ids: list[list[int]]) -> list[Generation]:
    results = []
    for prompt, x, new in zip(prompts, ids, new_ids):
        if tokenizer.eos_token_id in new:  # stop at the first end-of-text (later ones are padding)
            new = new[: new.index(tokenizer.eos_token_id)]
        results.append(Generation(prompt, tokenizer.decode(new), len(x), len(new)))
    return results


def _generate_static(model, tokenizer, prompts, ids, options: SamplingOptions, max_new: int) -> list[Generation]:
    """generate_text's work with the StaticDecoder: the prompts as one unpadded batch, one compiled step."""
    from deep_delta.hf.decode import shared_decoder

    lengths = sorted({len(x) for x in ids})
    if len(lengths) > 1:
        raise ValueError(
            f"`prompts`: with `compile` every prompt must have the same number of tokens (the fixed-shape cache "
            f"holds no padding), got lengths {lengths}; give prompts of one length, or decode without `compile`"
        )
    device = next(model.parameters()).device
    generator = None
    if options.sampled and options.seed is not None:
        generator = torch.Generator(device=device).manual_seed(options.seed)
    decoder = shared_decoder(model, len(ids), lengths[0] + max_new)  # compiled once per model and shape
    new = decoder.generate(torch.tensor(ids, device=device), max_new, lambda logits: options.pick(logits, generator),
                           tokenizer.eos_token_id)
    return _results(tokenizer, prompts, ids, new.tolist())
