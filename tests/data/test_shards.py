import numpy as np
import pytest

from deep_delta.data.shards import (
    HEADER_BYTES,
    MAGIC,
    ShardError,
    max_token_id,
    open_shard,
    read_header,
    write_shard,
)


def test_round_trip_and_layout(tmp_path):
    tokens = np.random.default_rng(0).integers(0, 65536, size=1000)
    path = tmp_path / "train_000000.bin"
    header = write_shard(path, tokens)
    assert header.num_tokens == 1000
    raw = path.read_bytes()
    assert len(raw) == HEADER_BYTES + 2 * 1000
    ints = np.frombuffer(raw[:HEADER_BYTES], dtype="<i4")
    assert ints[0] == MAGIC and ints[1] == 1 and ints[2] == 1000 and not ints[3:].any()
    assert read_header(path).num_tokens == 1000
    np.testing.assert_array_equal(open_shard(path), tokens)
    assert max_token_id(open_shard(path), chunk=7) == tokens.max()
    # no temporary files are left behind
    assert [p.name for p in tmp_path.iterdir()] == ["train_000000.bin"]


def test_empty_shard(tmp_path):
    write_shard(tmp_path / "a.bin", [])
    assert read_header(tmp_path / "a.bin").num_tokens == 0
    assert len(open_shard(tmp_path / "a.bin")) == 0


def test_atomic_overwrite_keeps_old_file_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "s.bin"
    write_shard(path, [1, 2, 3])

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr("os.fsync", boom)
    with pytest.raises(OSError, match="disk full"):
        write_shard(path, [4, 5, 6, 7])
    monkeypatch.undo()
    np.testing.assert_array_equal(open_shard(path), [1, 2, 3])
    assert [p.name for p in tmp_path.iterdir()] == ["s.bin"]


@pytest.mark.parametrize("bad", [65536, -1, 70000])
def test_refuses_ids_outside_uint16(tmp_path, bad):
    with pytest.raises(ShardError, match=f"token id {bad} does not fit in uint16"):
        write_shard(tmp_path / "s.bin", [0, bad, 3])
    assert not (tmp_path / "s.bin").exists()


def test_missing_shard(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.bin does not exist"):
        read_header(tmp_path / "nope.bin")


def test_bad_magic(tmp_path):
    path = tmp_path / "s.bin"
    write_shard(path, [1, 2, 3])
    raw = bytearray(path.read_bytes())
    raw[0] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(ShardError, match=r"s\.bin is not a token shard or is corrupted: magic number"):
        open_shard(path)


def test_bad_version(tmp_path):
    path = tmp_path / "s.bin"
    write_shard(path, [1, 2, 3])
    raw = bytearray(path.read_bytes())
    raw[4:8] = np.int32(2).tobytes()
    path.write_bytes(bytes(raw))
    with pytest.raises(ShardError, match="has version 2"):
        read_header(path)


def test_truncated_tokens(tmp_path):
    path = tmp_path / "s.bin"
    write_shard(path, np.arange(100))
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(ShardError, match=r"s\.bin is truncated: header says 100 tokens"):
        read_header(path)


def test_truncated_header(tmp_path):
    path = tmp_path / "s.bin"
    path.write_bytes(b"\x00" * 100)
    with pytest.raises(ShardError, match="shorter than the 1024-byte header"):
        read_header(path)


def test_trailing_garbage(tmp_path):
    path = tmp_path / "s.bin"
    write_shard(path, np.arange(10))
    path.write_bytes(path.read_bytes() + b"xx")
    with pytest.raises(ShardError, match="is corrupted: header says 10 tokens"):
        read_header(path)
