"""Sources that cannot be read (text that is not UTF-8, corrupt parquet, bad jsonl records) are one-line errors
naming the file and the line and byte, or the row: not a raw codec or pyarrow traceback."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from data_helpers import TEXT, one_line_error

from deep_delta.data import DataError, prepare


def test_txt_that_is_not_utf8_names_file_line_and_byte(tmp_path, capsys):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("first line\ncaf\xe9 au lait\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"latin1\.txt, line 2: not valid UTF-8 at byte 14 \(got 0xe9"):
        prepare(bad, "byte", tmp_path / "o", progress=False)
    err = one_line_error(capsys, 2, ["data", "prepare", "--source", str(bad), "--out", str(tmp_path / "o")])
    assert err.startswith("ddl data: error: ") and str(bad) in err and "byte 14" in err
    assert not (tmp_path / "o").exists()


def test_jsonl_that_is_not_utf8_names_file_line_and_byte(tmp_path):
    bad = tmp_path / "c.jsonl"
    good = json.dumps({"text": "fine"}) + "\n"
    bad.write_bytes(good.encode() * 3 + b'{"text": "caf\xe9"}\n')
    at = 3 * len(good) + len('{"text": "caf')
    with pytest.raises(DataError, match=rf"c\.jsonl, line 4: not valid UTF-8 at byte {at} \(got 0xe9"):
        prepare(bad, "byte", tmp_path / "o", progress=False)


def test_jsonl_records_are_named_by_line(tmp_path):
    bad = tmp_path / "c.jsonl"
    bad.write_text('{"text": "a"}\n\n{"title": "b"}\n')
    with pytest.raises(DataError, match=r"c\.jsonl, line 3: record has no 'text' field \(got \['title'\]\)"):
        prepare(bad, "byte", tmp_path / "o", progress=False)
    bad.write_text('{"text": "a"}\n{"text": [1]}\n')
    with pytest.raises(DataError, match=r"c\.jsonl, line 2: record has a 'text' field of type list"):
        prepare(bad, "byte", tmp_path / "o", progress=False)


def test_garbage_parquet_names_the_file(tmp_path, capsys):
    bad = tmp_path / "rows.parquet"
    bad.write_bytes(b"these are not the parquet bytes you are looking for" * 10)
    with pytest.raises(DataError, match=r"rows\.parquet: not a readable parquet file \(.*magic bytes"):
        prepare(bad, "byte", tmp_path / "o", progress=False)
    err = one_line_error(capsys, 2, ["data", "prepare", "--source", str(bad), "--out", str(tmp_path / "o")])
    assert str(bad) in err


def test_parquet_damaged_inside_names_the_file(tmp_path):
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"text": [f"{i} {TEXT}" for i in range(200)]}), path, compression="none",
                   use_dictionary=False)
    raw = bytearray(path.read_bytes())
    raw[100 : len(raw) - 300] = b"A" * (len(raw) - 400)  # pages overwritten, footer intact
    path.write_bytes(bytes(raw))
    with pytest.raises(DataError, match=r"rows\.parquet: .*parquet"):
        prepare(path, "byte", tmp_path / "o", progress=False)
