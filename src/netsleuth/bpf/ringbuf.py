"""Consumer of a BPF ring buffer: raw records are copied out in libbpf's callback and handed over in batches.

The callback only copies bytes (decoding happens in the caller, in bulk) so the consumer keeps up with the
highest rate Python can manage; what it cannot take is sampled in the kernel, never silently lost.
"""

from __future__ import annotations

import ctypes
import errno

from netsleuth.bpf import _libbpf
from netsleuth.bpf.errors import last_errno_error

__all__ = ["RingBuffer"]

_BATCH = 4096


class RingBuffer:
    def __init__(self, map_fd: int) -> None:
        self._lib = _libbpf.lib()
        self._pending: list[bytes] = []
        self._batch_full = False
        # Keep the callback object alive as long as libbpf may call it.
        self._callback = _libbpf.RingBufferCallback(self._on_record)
        with _libbpf.capture_messages() as messages:
            self._handle: int | None = self._lib.ring_buffer__new(map_fd, self._callback, None, None)
        if not self._handle:
            raise last_errno_error("cannot open the BPF ring buffer", messages)

    def _on_record(self, _ctx: int | None, data: int | None, size: int) -> int:
        self._pending.append(ctypes.string_at(data or 0, size))
        # libbpf keeps reading while the producer keeps writing; a negative return makes it store the consumer
        # position and return, so a storm never keeps us from the clock (progress, deadlines, Ctrl-C).
        if len(self._pending) >= _BATCH:
            self._batch_full = True
            return -1
        return 0

    def poll(self, timeout_ms: int) -> list[bytes]:
        """Wait up to timeout_ms for records; returns those that arrived (possibly none)."""
        if self._handle is None:
            return []
        result = self._lib.ring_buffer__poll(self._handle, timeout_ms)
        # EINTR is a signal (e.g. Ctrl-C), and our own -1 a full batch: neither is an error.
        if result < 0 and not self._batch_full and ctypes.get_errno() != errno.EINTR:
            raise last_errno_error("reading the BPF ring buffer failed")
        self._batch_full = False
        records, self._pending = self._pending, []
        return records

    def drain(self) -> list[bytes]:
        """Everything still queued, without waiting (used at exit so nothing produced is left unread)."""
        if self._handle is None:
            return []
        records: list[bytes] = []
        while True:
            self._lib.ring_buffer__consume(self._handle)
            self._batch_full = False
            if not self._pending:
                return records
            records.extend(self._pending)
            self._pending = []

    def close(self) -> None:
        if self._handle:
            self._lib.ring_buffer__free(self._handle)
        self._handle = None
