"""Tiny GPT-2-style BPE files written by the tests (the real GPT-2 files cannot be downloaded offline)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

MERGES = [("t", "h"), ("th", "e"), (" ", "t"), (" t", "h"), (" th", "e"), ("a", "n"), (" ", "an")]


def byte_alphabet() -> tuple[list[int], dict[int, str]]:
    """GPT-2's byte order (printable bytes first) and its printable stand-in character for each byte."""
    order = [b for b in range(256) if chr(b).isprintable() and chr(b) != " "]
    char = {b: chr(b) for b in order}
    n = 0
    for b in range(256):
        if b not in char:
            order.append(b)
            char[b] = chr(256 + n)
            n += 1
    return order, char


def ranks() -> dict[bytes, int]:
    order, _ = byte_alphabet()
    out = {bytes([b]): i for i, b in enumerate(order)}
    for a, b in MERGES:
        out[(a + b).encode()] = len(out)
    return out


def write_tiktoken(path: Path) -> Path:
    lines = [base64.b64encode(tok) + b" " + str(rank).encode() for tok, rank in ranks().items()]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def write_data_gym(directory: Path, merges_name: str = "vocab.bpe", vocab_name: str = "encoder.json") -> Path:
    """GPT-2's original format: merges ("#version" line, then "a b" per line) and a JSON token -> id map."""
    _, char = byte_alphabet()

    def show(text: str) -> str:
        return "".join(char[b] for b in text.encode())

    directory.mkdir(parents=True, exist_ok=True)
    (directory / merges_name).write_text(
        "#version: 0.2\n" + "".join(f"{show(a)} {show(b)}\n" for a, b in MERGES), encoding="utf-8"
    )
    encoder = {"".join(char[b] for b in tok): rank for tok, rank in ranks().items()}
    encoder["<|endoftext|>"] = len(encoder)
    (directory / vocab_name).write_text(json.dumps(encoder), encoding="utf-8")
    return directory
