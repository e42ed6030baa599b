"""Token data: tokenizers, llm.c-layout shards, preparation from text sources, and the training loader.

    from deep_delta.data import TokenLoader, default_data_dir

    loader = TokenLoader(default_data_dir(), "train", batch_size=8, seq_len=256, seed=0, vocab_size=257)
    x, y = loader.next_batch()  # (8, 256) int64 each; y = next tokens of x

Importing the package needs no PyTorch (``TokenLoader`` imports it to make a batch): ``ddl``'s parser reads
:class:`PrepareSettings` from here.
"""

from deep_delta.data.cache import default_cache_dir
from deep_delta.data.default import default_data_dir, prose_data_dir
from deep_delta.data.errors import DataError, DataUnavailableError
from deep_delta.data.loader import TokenLoader
from deep_delta.data.meta import read_meta
from deep_delta.data.prepare import (
    check_data_dir,
    find_prepared,
    inspect_data_dir,
    prepare,
    prepare_from,
    write_dataset,
)
from deep_delta.data.settings import PrepareSettings
from deep_delta.data.shards import ShardError, ShardHeader, open_shard, read_header, write_shard
from deep_delta.data.tokenizers import ByteTokenizer, TiktokenTokenizer, get_tokenizer
from deep_delta.data.verify import verify_data_dir

__all__ = [
    "ByteTokenizer",
    "DataError",
    "DataUnavailableError",
    "PrepareSettings",
    "ShardError",
    "ShardHeader",
    "TiktokenTokenizer",
    "TokenLoader",
    "check_data_dir",
    "default_cache_dir",
    "default_data_dir",
    "find_prepared",
    "get_tokenizer",
    "inspect_data_dir",
    "open_shard",
    "prepare",
    "prepare_from",
    "prose_data_dir",
    "read_header",
    "read_meta",
    "verify_data_dir",
    "write_dataset",
    "write_shard",
]
