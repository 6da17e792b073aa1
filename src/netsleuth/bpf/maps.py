"""Access to a loaded BPF map by fd: lookup, update, delete, iterate, per-CPU values."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Iterator
from pathlib import Path

from netsleuth.bpf import _libbpf
from netsleuth.bpf.errors import last_errno_error

__all__ = ["BpfMap", "possible_cpus"]


@functools.cache
def possible_cpus(path: Path = Path("/sys/devices/system/cpu/possible")) -> int:
    """Per-CPU maps hold one slot per *possible* CPU ("0-3,8-11" style list), not per online one."""
    count = 0
    for part in path.read_text().strip().split(","):
        low, _, high = part.partition("-")
        count += int(high or low) - int(low) + 1
    return count


class BpfMap:
    """One map of a loaded object. Keys and values are raw bytes; the diagnostic decodes them."""

    def __init__(self, name: str, fd: int, key_size: int, value_size: int, per_cpu: bool = False) -> None:
        self.name = name
        self.fd = fd
        self.key_size = key_size
        self.value_size = value_size
        self.per_cpu = per_cpu
        self._lib = _libbpf.lib()
        # Kernel per-CPU values are each rounded up to 8 bytes (kernel/bpf/syscall.c bpf_map_value_size).
        self._slot = (value_size + 7) // 8 * 8
        self._buffer_size = self._slot * possible_cpus() if per_cpu else value_size

    def lookup(self, key: bytes) -> bytes | None:
        value = ctypes.create_string_buffer(self._buffer_size)
        if self._lib.bpf_map_lookup_elem(self.fd, key, value) != 0:
            return None
        return value.raw

    def lookup_per_cpu(self, key: bytes) -> list[bytes]:
        raw = self.lookup(key)
        if raw is None:
            return []
        return [raw[i : i + self.value_size] for i in range(0, len(raw), self._slot)]

    def update(self, key: bytes, value: bytes, flags: int = 0) -> None:
        if self._lib.bpf_map_update_elem(self.fd, key, value, flags) != 0:
            raise last_errno_error(f"cannot update BPF map {self.name}")

    def delete(self, key: bytes) -> bool:
        return bool(self._lib.bpf_map_delete_elem(self.fd, key) == 0)

    def keys(self) -> Iterator[bytes]:
        """All keys; a key deleted while iterating restarts nothing (the kernel continues from the next)."""
        current = ctypes.create_string_buffer(self.key_size)
        following = ctypes.create_string_buffer(self.key_size)
        pointer: ctypes.Array[ctypes.c_char] | None = None
        while self._lib.bpf_map_get_next_key(self.fd, pointer, following) == 0:
            yield following.raw
            ctypes.memmove(current, following, self.key_size)
            pointer = current

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        for key in self.keys():
            value = self.lookup(key)
            if value is not None:
                yield key, value

    def clear(self) -> None:
        for key in list(self.keys()):
            self.delete(key)
