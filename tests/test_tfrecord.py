"""The TFRecord reader and tf.train.Example decoder, on bytes whose values are known independently."""

import struct

import numpy as np
import pytest

from tests.tfds_fixtures import serialize_example
from vlbench.datasets.tfrecord import (
    TfRecordError,
    count_records,
    iter_records,
    masked_crc,
    parse_example,
    write_records,
)


def test_crc32c_matches_published_check_values():
    import google_crc32c

    # the CRC-32C "check" value of b"123456789", and RFC 3720 (iSCSI) App. B.4's 32-byte test vectors
    assert google_crc32c.value(b"123456789") == 0xE3069283
    assert google_crc32c.value(bytes(32)) == 0x8A9136AA
    assert google_crc32c.value(b"\xff" * 32) == 0x62A8AB43
    assert google_crc32c.value(bytes(range(32))) == 0x46DD794E
    # TensorFlow's mask: rotate right by 15 bits, add 0xa282ead8
    crc = 0xE3069283
    assert masked_crc(b"123456789") == (((crc >> 15) | (crc << 17)) + 0xA282EAD8) % 2**32


def test_records_framing_round_trip_and_skip(tmp_path):
    path = tmp_path / "x.tfrecord"
    records = [b"", b"a", b"hello" * 100, bytes(range(256))]
    write_records(path, records)
    raw = path.read_bytes()
    # framing by hand: 8-byte length, 4-byte masked crc of it, data, 4-byte masked crc of data
    assert raw[:8] == struct.pack("<Q", 0) and raw[8:12] == struct.pack("<I", masked_crc(bytes(8)))
    assert len(raw) == sum(16 + len(r) for r in records)
    assert list(iter_records(path)) == records
    assert list(iter_records(path, skip=2)) == records[2:]
    assert list(iter_records(path, skip=1, limit=2)) == records[1:3]
    assert count_records(path) == count_records(path, verify_data=False) == 4


def test_damaged_and_truncated_records_are_refused_naming_file_and_record(tmp_path):
    path = tmp_path / "x.tfrecord"
    write_records(path, [b"first", b"second", b"third"])
    raw = bytearray(path.read_bytes())
    second_data = 16 + 5 + 12  # record 0 is 16 + 5 bytes; record 1's data starts after its 12-byte header
    raw[second_data] ^= 1
    path.write_bytes(bytes(raw))
    with pytest.raises(TfRecordError, match=r"x\.tfrecord: record 1 has a bad data checksum"):
        list(iter_records(path))
    assert count_records(path, verify_data=False) == 3  # the header-only count does not read the data
    raw[second_data] ^= 1
    raw[16 + 5 + 2] ^= 1  # record 1's length
    path.write_bytes(bytes(raw))
    with pytest.raises(TfRecordError, match="record 1 has a bad length checksum"):
        count_records(path, verify_data=False)
    raw[16 + 5 + 2] ^= 1
    path.write_bytes(bytes(raw[:-3]))
    for read in (lambda: list(iter_records(path)), lambda: count_records(path, verify_data=False)):
        with pytest.raises(TfRecordError, match=r"x\.tfrecord: record 2 is truncated"):
            read()
    path.write_bytes(bytes(raw[:16 + 5 + 7]))
    with pytest.raises(TfRecordError, match="record 1 is truncated"):
        list(iter_records(path))


def test_example_bytes_written_by_hand_are_decoded():
    # Example{features{feature{key: "a" value{int64_list{value: [1]}}}}}, packed, computed by hand from the
    # protobuf wire format: Int64List 0a 01 01; Feature 1a 03 ..; map entry 0a 01 'a' 12 05 ..; Features 0a 0a ..
    data = bytes.fromhex("0a0c" "0a0a" "0a0161" "1205" "1a03" "0a0101")
    out = parse_example(data)
    assert list(out) == ["a"] and out["a"].dtype == np.int64 and out["a"].tolist() == [1]
    # unpacked int64 [2, -1] (-1 is ten varint bytes), a float list [1.5] and a bytes list [b"xy", b""]
    ints = bytes.fromhex("0802" "08ffffffffffffffffff01")
    floats = bytes.fromhex("0a04") + struct.pack("<f", 1.5)
    blobs = bytes.fromhex("0a02") + b"xy" + bytes.fromhex("0a00")

    def entry(key: bytes, feature_field: int, payload: bytes) -> bytes:
        feature = bytes([feature_field << 3 | 2, len(payload)]) + payload
        body = bytes([0x0A, len(key)]) + key + bytes([0x12, len(feature)]) + feature
        return bytes([0x0A, len(body)]) + body

    features = entry(b"i", 3, ints) + entry(b"f", 2, floats) + entry(b"b", 1, blobs)
    out = parse_example(bytes([0x0A, len(features)]) + features)
    assert out["i"].tolist() == [2, -1]
    assert out["f"].dtype == np.float32 and out["f"].tolist() == [1.5]
    assert out["b"] == [b"xy", b""]


def test_serialize_example_round_trips_and_matches_hand_bytes():
    assert serialize_example({"a": [1]}) == bytes.fromhex("0a0c0a0a0a016112051a030a0101")
    out = parse_example(serialize_example({"image": [b"\x89PNG..."], "n": np.array([3, -7, 2**40]),
                                           "xy": np.array([0.25, -2.0], np.float32)}))
    assert out["image"] == [b"\x89PNG..."]
    assert out["n"].tolist() == [3, -7, 2**40]
    assert out["xy"].tolist() == [0.25, -2.0]


def test_not_an_example_is_a_value_error():
    with pytest.raises(ValueError):
        parse_example(b"\x0a\x05ab")  # a length-delimited field longer than the buffer
