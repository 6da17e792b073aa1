"""Renderers: typed records in, bytes or text out (tables, live view, JSON lines, pcapng).

A renderer never touches libbpf or the kernel; it only formats what a diagnostic produced.
"""

__all__: list[str] = []
