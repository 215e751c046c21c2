"""Durable hand-off between the proxy and Kafka: append-only, fsync'd segment files.

Every record is written here before it is handed to the producer and stays until Kafka confirms
its delivery, so a slow or absent Kafka never loses a call and never blocks one. A segment file is
deleted once all its records are confirmed; on start, the records of surviving segments are sent
again (their event ids are fixed inside the record, so a copy that did reach Kafka before a crash
is recognisable downstream).

Frame: 4-byte big-endian payload length, 4-byte CRC-32 of the payload, payload = 2-byte key
length, key, value. A torn frame at the end of a segment (crash mid-write) is cut off on open.
"""

from __future__ import annotations

import bisect
import fcntl
import itertools
import logging
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)
_HEADER = struct.Struct(">II")
_KEY_LEN = struct.Struct(">H")
SUFFIX = ".seg"


@dataclass(frozen=True)
class SpoolRecord:
    seq: int
    key: bytes
    value: bytes


@dataclass
class _Segment:
    path: Path
    first_seq: int
    # (offset, frame length) of each record, by position in the file.
    frames: list[tuple[int, int]] = field(default_factory=list)
    acked: int = 0
    read_fd: int | None = None

    def read(self, index: int) -> tuple[bytes, bytes]:
        if self.read_fd is None:
            self.read_fd = os.open(self.path, os.O_RDONLY)
        offset, length = self.frames[index]
        return _decode_payload(os.pread(self.read_fd, length - _HEADER.size, offset + _HEADER.size))

    def close_reader(self) -> None:
        if self.read_fd is not None:
            os.close(self.read_fd)
            self.read_fd = None

    @property
    def done(self) -> bool:
        return self.acked == len(self.frames)


def encode_frame(key: bytes, value: bytes) -> bytes:
    payload = _KEY_LEN.pack(len(key)) + key + value
    return _HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def _decode_payload(payload: bytes) -> tuple[bytes, bytes]:
    (key_len,) = _KEY_LEN.unpack_from(payload)
    return payload[2:2 + key_len], payload[2 + key_len:]


def _scan(path: Path) -> tuple[list[tuple[int, int]], int]:
    """Valid frames of a segment and the offset where they end."""
    data = path.read_bytes()
    frames: list[tuple[int, int]] = []
    offset = 0
    while offset + _HEADER.size <= len(data):
        length, crc = _HEADER.unpack_from(data, offset)
        end = offset + _HEADER.size + length
        if end > len(data) or zlib.crc32(data[offset + _HEADER.size:end]) != crc:
            break
        frames.append((offset, end - offset))
        offset = end
    return frames, offset


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SpoolBusyError(RuntimeError):
    """Another process owns this spool directory."""


class Spool:
    """Not thread-safe: owned by the emitter thread alone."""

    def __init__(self, directory: Path, segment_records: int = 1000) -> None:
        self.directory = directory
        self.segment_records = segment_records
        self._segments: dict[int, _Segment] = {}
        self._active: _Segment | None = None
        self._active_file: int | None = None
        self._next_seq = 0
        # Records written but neither handed to the producer nor confirmed, oldest first.
        self._unsent: dict[int, None] = {}
        self._in_flight: set[int] = set()
        self._lock_fd: int | None = None

    def open(self) -> int:
        """Recover segments left by an earlier run; returns how many records await delivery.

        Raises SpoolBusyError when another process holds this spool (two would send it twice).
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.directory / "LOCK", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            self._lock_fd = None
            raise SpoolBusyError(f"spool {self.directory} is in use by another process") from None
        for path in sorted(self.directory.glob(f"*{SUFFIX}")):
            first_seq = int(path.stem)
            frames, valid_end = _scan(path)
            if valid_end != path.stat().st_size:
                logger.warning("spool segment %s: cutting a torn frame at byte %d", path.name, valid_end)
                with path.open("r+b") as handle:
                    handle.truncate(valid_end)
                    os.fsync(handle.fileno())
            if not frames:
                path.unlink()
                continue
            segment = _Segment(path, first_seq, frames)
            self._segments[first_seq] = segment
            self._unsent.update((first_seq + i, None) for i in range(len(frames)))
            self._next_seq = max(self._next_seq, first_seq + len(frames))
        return len(self._unsent)

    @property
    def pending(self) -> int:
        """Records not yet confirmed by Kafka."""
        return len(self._unsent) + len(self._in_flight)

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def append(self, records: list[tuple[bytes, bytes]]) -> int:
        """Write records durably (one fsync per segment touched) before any is handed to the producer.

        Returns how many of them are now in the spool, in order. On a write error (a full disk) the
        partly written frames are cut back, so a retry of the rest never duplicates; the error is raised
        when not even the first record could be written.
        """
        written = 0
        while written < len(records):
            if self._active is None or len(self._active.frames) >= self.segment_records:
                self._rotate()
            assert self._active is not None and self._active_file is not None
            chunk = records[written:written + self.segment_records - len(self._active.frames)]
            frames = [encode_frame(key, value) for key, value in chunk]
            start = os.lseek(self._active_file, 0, os.SEEK_END)
            try:
                _write_all(self._active_file, b"".join(frames))
                os.fsync(self._active_file)
            except OSError:
                os.ftruncate(self._active_file, start)
                if written:
                    return written  # report what is durable; the next call meets the error again
                raise
            offset = start
            for frame in frames:
                self._active.frames.append((offset, len(frame)))
                self._unsent[self._next_seq] = None
                self._next_seq += 1
                offset += len(frame)
            written += len(chunk)
        return written

    def _rotate(self) -> None:
        self._close_active()
        path = self.directory / f"{self._next_seq:020d}{SUFFIX}"
        self._active_file = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._active = _Segment(path, self._next_seq)
        self._segments[self._next_seq] = self._active
        _fsync_dir(self.directory)

    def _close_active(self) -> None:
        if self._active_file is not None:
            os.close(self._active_file)
        self._active_file = None
        self._active = None

    def _segment_of(self, seq: int) -> _Segment:
        starts = sorted(self._segments)
        return self._segments[starts[bisect.bisect_right(starts, seq) - 1]]

    def take_unsent(self, limit: int) -> Iterator[SpoolRecord]:
        """Records to hand to the producer, oldest first; each is in flight until acked or retried."""
        for seq in list(itertools.islice(self._unsent, limit)):
            record = self.read(seq)
            del self._unsent[seq]
            self._in_flight.add(seq)
            yield record

    def read(self, seq: int) -> SpoolRecord:
        segment = self._segment_of(seq)
        key, value = segment.read(seq - segment.first_seq)
        return SpoolRecord(seq, key, value)

    def ack(self, seq: int) -> None:
        """Kafka confirmed the record (or it was set aside for good)."""
        if seq in self._in_flight:
            self._in_flight.discard(seq)
            self._segment_of(seq).acked += 1

    def retry(self, seq: int) -> None:
        """Delivery failed: send it again later."""
        if seq in self._in_flight:
            self._in_flight.discard(seq)
            self._unsent[seq] = None

    def release_in_flight(self) -> None:
        """The producer was replaced: whatever it held must be sent again."""
        for seq in sorted(self._in_flight):
            self._unsent[seq] = None
        self._in_flight.clear()

    def trim(self) -> int:
        """Delete fully confirmed segments; returns how many were deleted."""
        done = [s for s in self._segments.values() if s.done and s.frames]
        for segment in done:
            if segment is self._active:
                self._close_active()
            segment.close_reader()
            segment.path.unlink(missing_ok=True)
            del self._segments[segment.first_seq]
        return len(done)

    def close(self) -> None:
        self._close_active()
        for segment in self._segments.values():
            segment.close_reader()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the lock
            self._lock_fd = None
