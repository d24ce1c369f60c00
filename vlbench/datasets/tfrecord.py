"""TFRecord files and `tf.train.Example` records, read and written without TensorFlow.

A TFRecord file is a sequence of records, each

    uint64 length (little-endian) | uint32 masked CRC32C of those 8 bytes | data | uint32 masked CRC32C of data

where mask(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8 (mod 2**32) (TensorFlow's `crc32c::Mask`,
tensorflow/core/lib/hash/crc32c.h; the record layout of tensorflow/core/lib/io/record_writer.cc). Both checksums
are verified: a damaged or truncated record is a `TfRecordError` naming the file and the record's index.
CRC32C (Castagnoli) comes from `google-crc32c` (Google's C implementation).

`tf.train.Example` (tensorflow/core/example/example.proto, feature.proto) is decoded with a small protobuf
wire-format reader: Example{1: Features{1: map<string, Feature>}}, Feature{1: BytesList, 2: FloatList,
3: Int64List}, each list {1: repeated values} (packed or not). `parse_example` gives {key: list[bytes] |
np.ndarray int64 | np.ndarray float32}.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

import google_crc32c
import numpy as np

from vlbench.datasets.canonical import DatasetError

_MASK_DELTA = 0xA282EAD8
_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")


class TfRecordError(DatasetError):
    """A TFRecord file or a tf.train.Example in it is damaged; the message names the file and record index."""


def masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def _read_header(f: BinaryIO, path: Path, index: int) -> int | None:
    """The next record's data length, its length checksum verified; None at a clean end of file."""
    head = f.read(_HEADER.size)
    if not head:
        return None
    if len(head) < _HEADER.size:
        raise TfRecordError(f"{path}: record {index} is truncated (only {len(head)} bytes of its 12-byte header)")
    length, crc = _HEADER.unpack(head)
    if masked_crc(head[:8]) != crc:
        raise TfRecordError(f"{path}: record {index} has a bad length checksum (the file is damaged)")
    return length


def iter_records(path: str | Path, skip: int = 0, limit: int | None = None) -> Iterator[bytes]:
    """The data of each record of `path`, checksums verified; the first `skip` records are passed over (their
    length checksums verified, their data not read), then at most `limit` records are yielded."""
    path = Path(path)
    with open(path, "rb") as f:
        index, given = 0, 0
        while limit is None or given < limit:
            length = _read_header(f, path, index)
            if length is None:
                if index < skip:
                    raise TfRecordError(f"{path}: has {index} records, fewer than the {skip} to skip")
                return
            if index < skip:
                f.seek(length + _FOOTER.size, 1)
            else:
                yield _read_data(f, path, index, length)
                given += 1
            index += 1


def _read_data(f: BinaryIO, path: Path, index: int, length: int) -> bytes:
    data = f.read(length)
    foot = f.read(_FOOTER.size)
    if len(data) < length or len(foot) < _FOOTER.size:
        raise TfRecordError(f"{path}: record {index} is truncated ({len(data)} of {length} data bytes)")
    if masked_crc(data) != _FOOTER.unpack(foot)[0]:
        raise TfRecordError(f"{path}: record {index} has a bad data checksum (the file is damaged)")
    return data


def count_records(path: str | Path, verify_data: bool = True) -> int:
    """How many records `path` holds, every length checksum verified, and every data checksum too unless
    `verify_data` is false (then the data is skipped, and a file that ends inside a record is still refused)."""
    path = Path(path)
    size = path.stat().st_size
    n = 0
    with open(path, "rb") as f:
        while (length := _read_header(f, path, n)) is not None:
            if verify_data:
                _read_data(f, path, n, length)
            else:
                end = f.tell() + length + _FOOTER.size
                if end > size:
                    raise TfRecordError(f"{path}: record {n} is truncated (the file ends {end - size} bytes early)")
                f.seek(end)
            n += 1
    return n


def write_records(path: str | Path, records: Iterable[bytes]) -> None:
    """A TFRecord file of `records`, streamed (used to build TFDS-prepared miniatures and stand-ins)."""
    with open(path, "wb") as f:
        for data in records:
            head = struct.pack("<Q", len(data))
            f.write(head + _FOOTER.pack(masked_crc(head)) + data + _FOOTER.pack(masked_crc(data)))


# ----------------------------------------------------------------------------------------------------------------
# tf.train.Example: protobuf wire format


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result, shift = 0, 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def _fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of a message: an int for varints, bytes for length-delimited and fixed."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 2:
            n, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + n], pos + n
            if len(value) < n:
                raise ValueError("truncated length-delimited field")
        elif wire in (1, 5):
            n = 8 if wire == 1 else 4
            value, pos = buf[pos:pos + n], pos + n
            if len(value) < n:
                raise ValueError("truncated fixed-width field")
        else:
            raise ValueError(f"unsupported wire type {wire}")
        yield number, wire, value


def _int64s(buf: bytes) -> np.ndarray:
    out = []
    for number, wire, value in _fields(buf):
        if number != 1:
            continue
        if wire == 2:  # packed
            pos = 0
            while pos < len(value):
                v, pos = _varint(value, pos)
                out.append(v)
        else:
            out.append(value)
    return np.array(out, dtype=np.uint64).astype(np.int64)  # two's complement of negative int64 values


def _floats(buf: bytes) -> np.ndarray:
    parts = [value if wire in (2, 5) else b"" for number, wire, value in _fields(buf) if number == 1]
    return np.frombuffer(b"".join(parts), dtype="<f4").astype(np.float32)


def _feature(buf: bytes) -> list[bytes] | np.ndarray:
    kinds = {1: lambda b: [v for n, _, v in _fields(b) if n == 1], 2: _floats, 3: _int64s}
    for number, _, value in _fields(buf):
        if number in kinds:
            return kinds[number](value)
    return []  # a Feature with no list set: TensorFlow parses it as empty


def parse_example(data: bytes) -> dict[str, list[bytes] | np.ndarray]:
    """{key: value list} of a serialised tf.train.Example; ValueError if it is not one."""
    out = {}
    for number, _, features in _fields(data):
        if number != 1:
            continue
        for n, _, entry in _fields(features):
            if n != 1:
                continue
            key, value = None, b""
            for k, _, v in _fields(entry):
                if k == 1:
                    key = v.decode("utf-8")
                elif k == 2:
                    value = v
            if key is None:
                raise ValueError("a feature map entry without its key")
            out[key] = _feature(value)
    return out


