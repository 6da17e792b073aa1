"""A pcapng writer for captured packets, with netsleuth's findings (drop reason, rule, location, netns) as
packet comments that Wireshark and tshark show (`frame.comment`).

Block layouts follow the pcapng specification, draft-ietf-opsawg-pcapng (section numbers below): every block
is `type, total length, body, total length` with the body padded to 32 bits (§3.1); options are
`code, length, value` padded to 32 bits and closed by opt_endofopt, and left out entirely when a block has
none (§3.5). Everything is written little-endian; the Section Header's byte-order magic tells readers so.
"""

from __future__ import annotations

import os
import platform
import struct
from collections.abc import Sequence
from types import TracebackType
from typing import BinaryIO, Self

from netsleuth import __version__
from netsleuth.errors import EnvironmentProblem, UsageError

__all__ = ["DEFAULT_SNAPLEN", "LINKTYPE_ETHERNET", "LINKTYPE_RAW", "PcapngWriter"]

# Link types from the tcpdump.org LINKTYPE registry (also draft-ietf-opsawg-pcaplinktype).
LINKTYPE_ETHERNET = 1
LINKTYPE_RAW = 101  # the packet starts at the IPv4 or IPv6 header
DEFAULT_SNAPLEN = 262144  # what tcpdump and Wireshark use as "no limit"

_BLOCK_SECTION_HEADER = 0x0A0D0D0A  # §4.1
_BLOCK_INTERFACE_DESCRIPTION = 0x00000001  # §4.2
_BLOCK_ENHANCED_PACKET = 0x00000006  # §4.3
_BYTE_ORDER_MAGIC = 0x1A2B3C4D

_OPT_ENDOFOPT = 0
_OPT_COMMENT = 1
_SHB_HARDWARE, _SHB_OS, _SHB_USERAPPL = 2, 3, 4
_IF_NAME, _IF_DESCRIPTION, _IF_TSRESOL = 2, 3, 9
_TSRESOL_NANOSECONDS = 9  # 10^-9 s per timestamp unit (§4.2, if_tsresol: high bit clear = power of 10)
_OPTION_MAX = 0xFFFF  # an option's length field is 16 bits


def _pad(length: int) -> bytes:
    return b"\0" * (-length % 4)


def _option(code: int, value: bytes) -> bytes:
    return struct.pack("<HH", code, len(value)) + value + _pad(len(value))


def _options(options: Sequence[tuple[int, bytes]]) -> bytes:
    if not options:
        return b""
    return b"".join(_option(code, value) for code, value in options) + struct.pack("<HH", _OPT_ENDOFOPT, 0)


def _utf8(text: str) -> bytes:
    """UTF-8, cut at a character boundary to fit an option's 16-bit length."""
    encoded = text.encode("utf-8")
    if len(encoded) > _OPTION_MAX:
        encoded = encoded[:_OPTION_MAX].decode("utf-8", errors="ignore").encode("utf-8")
    return encoded


def _block(block_type: int, body: bytes) -> bytes:
    body += _pad(len(body))
    total = len(body) + 12
    return struct.pack("<II", block_type, total) + body + struct.pack("<I", total)


class PcapngWriter:
    """Writes one pcapng section: a Section Header Block, an Interface Description Block per link type (on
    first use), then one Enhanced Packet Block per packet.

    `destination` is a path (created or truncated, closed by close()) or a binary file object (left open).
    """

    def __init__(
        self,
        destination: str | os.PathLike[str] | BinaryIO,
        snaplen: int = DEFAULT_SNAPLEN,
        application: str = f"netsleuth {__version__}",
    ) -> None:
        # 0 is the spec's "no limit" (§4.2, SnapLen).
        if not 0 <= snaplen <= 0xFFFFFFFF:
            raise UsageError(f"snap length must be between 0 (no limit) and {0xFFFFFFFF}, not {snaplen}")
        self.snaplen = snaplen
        self._owns_file = isinstance(destination, (str, os.PathLike))
        if isinstance(destination, (str, os.PathLike)):
            try:
                self._file: BinaryIO = open(destination, "wb")  # noqa: SIM115 - closed by close()
            except OSError as error:
                raise UsageError(
                    f"cannot write pcapng file {os.fspath(destination)}: {error.strerror}"
                ) from error
        else:
            self._file = destination
        self._interfaces: dict[int, int] = {}  # link type → interface id (IDB order)
        self._closed = False
        self.packets_written = 0
        self._write(self._section_header(application))

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Flush; close the file when the writer opened it."""
        if self._closed:
            return
        self._closed = True
        self._file.flush()
        if self._owns_file:
            self._file.close()

    def flush(self) -> None:
        self._file.flush()

    def write_packet(
        self,
        timestamp_ns: int,
        data: bytes,
        original_length: int | None = None,
        comments: Sequence[str] = (),
        linktype: int = LINKTYPE_RAW,
    ) -> None:
        """Append one Enhanced Packet Block (§4.3).

        `timestamp_ns` is nanoseconds since the Unix epoch; `data` the captured bytes (cut to the snap
        length); `original_length` the packet's length on the wire (default len(data)); each comment becomes
        one opt_comment.
        """
        if self._closed:
            raise ValueError("write_packet() on a closed PcapngWriter")
        if timestamp_ns < 0 or timestamp_ns >> 64:
            raise ValueError(f"timestamp {timestamp_ns} does not fit pcapng's unsigned 64-bit timestamp")
        # An original length below the captured one is invalid pcapng; a caller's length taken from a header
        # that disagrees with the bytes must not abort a capture session, so trust the bytes instead.
        original_length = min(max(original_length or 0, len(data)), 0xFFFFFFFF)
        interface = self._interface(linktype)
        captured = bytes(data[: self.snaplen] if self.snaplen else data)
        body = (
            struct.pack(
                "<IIIII",
                interface,
                timestamp_ns >> 32,  # high and low 32 bits, in if_tsresol units (nanoseconds here)
                timestamp_ns & 0xFFFFFFFF,
                len(captured),
                original_length,
            )
            + captured
            + _pad(len(captured))
            + _options([(_OPT_COMMENT, _utf8(comment)) for comment in comments])
        )
        self._write(_block(_BLOCK_ENHANCED_PACKET, body))
        self.packets_written += 1

    def _interface(self, linktype: int) -> int:
        interface = self._interfaces.get(linktype)
        if interface is None:
            if not 0 <= linktype <= 0xFFFF:
                raise ValueError(f"link type {linktype} does not fit 16 bits")
            interface = len(self._interfaces)
            self._interfaces[linktype] = interface
            name = "netsleuth-ip" if linktype == LINKTYPE_RAW else f"netsleuth-linktype-{linktype}"
            body = struct.pack("<HHI", linktype, 0, self.snaplen) + _options(
                [
                    (_IF_NAME, _utf8(name)),
                    (_IF_DESCRIPTION, _utf8("packets seen by netsleuth's kernel probes")),
                    (_IF_TSRESOL, bytes([_TSRESOL_NANOSECONDS])),
                ]
            )
            self._write(_block(_BLOCK_INTERFACE_DESCRIPTION, body))
        return interface

    @staticmethod
    def _section_header(application: str) -> bytes:
        # Section length -1: not known in advance (we stream), which §4.1 allows.
        body = struct.pack("<IHHq", _BYTE_ORDER_MAGIC, 1, 0, -1) + _options(
            [
                (_SHB_HARDWARE, _utf8(platform.machine())),
                (_SHB_OS, _utf8(f"{platform.system()} {platform.release()}")),
                (_SHB_USERAPPL, _utf8(application)),
            ]
        )
        return _block(_BLOCK_SECTION_HEADER, body)

    def _write(self, block: bytes) -> None:
        try:
            self._file.write(block)
        except OSError as error:
            # A full disk or a reader that went away (`| tshark -r -` quitting): the machine's doing.
            raise EnvironmentProblem(f"cannot write pcapng output: {error.strerror}") from error
