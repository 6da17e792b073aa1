"""Whether a namespace's firewall rules changed since they were read, known without running a tool.

Reading the rules (iptables-save, nft -j, in the namespace) forks this process and runs several tools: tens
of milliseconds each time. Under a drop storm the matcher used to do it twice a second, and that was half of
the `drops` consumer's CPU. What can change its answers is small and cheap to watch:

- nf_tables (nft and iptables-nft alike): the ruleset's generation, which every committed transaction
  bumps - NFT_MSG_GETGEN over a netfilter netlink socket made in the namespace once (include/uapi/linux/
  netfilter/nf_tables.h; the same request `nft monitor` and libnftnl's nftnl_gen use);
- iptables-legacy (x_tables): its rules have no generation. Which legacy tables exist is in the namespace's
  /proc/net/ip_tables_names and ip6_tables_names, kept open from inside it; a namespace with any legacy
  table has no version (its rules are read each time, as before), nor one where the x_tables module came
  after the files were looked for.

`RulesetVersion()` is that token, or None when it cannot be known. Counters are not in it: they grow with
every drop, and the matcher reads them again whenever an answer depended on them.
"""

from __future__ import annotations

import os
import socket
import struct

from netsleuth.errors import EnvironmentProblem
from netsleuth.kernel.netns_exec import files_in_netns, sockets_in_netns

__all__ = ["RulesetVersion"]

_NETLINK_NETFILTER = 12
_NFNL_SUBSYS_NFTABLES = 10
_NFT_MSG_NEWGEN, _NFT_MSG_GETGEN = 15, 16
_NFTA_GEN_ID = 1
_NLM_F_REQUEST = 1
_NLMSG_ERROR = 2
_HEADER = struct.Struct("=IHHII")  # struct nlmsghdr
_NFGENMSG = struct.Struct("=BBH")  # struct nfgenmsg: family, version, res_id (be16)
_ATTRIBUTE = struct.Struct("=HH")  # struct nlattr
_LEGACY_NAMES = ("/proc/self/net/ip_tables_names", "/proc/self/net/ip6_tables_names")


class RulesetVersion:
    """The rules' version in one namespace (`netns_path`, None: this process's own). Call it for the token;
    close it when done. EnvironmentProblem from the constructor when the namespace cannot be entered."""

    def __init__(self, netns_path: str | None) -> None:
        self._sequence = 0
        self._closed = False
        if netns_path is None:
            self._socket = socket.socket(
                socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, _NETLINK_NETFILTER
            )
            self._legacy = [_open_or_none(path) for path in _LEGACY_NAMES]
        else:
            made = sockets_in_netns([netns_path], socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_NETFILTER)
            sockets = made[netns_path]
            if isinstance(sockets, OSError):
                raise EnvironmentProblem(str(sockets))
            (self._socket,) = sockets
            self._legacy = files_in_netns(netns_path, _LEGACY_NAMES)
        self._socket.settimeout(1.0)

    def __call__(self) -> tuple[int, ...] | None:
        if self._closed:
            return None
        for fd, path in zip(self._legacy, _LEGACY_NAMES, strict=True):
            if fd is None:
                # Its module came after the file was looked for (every namespace has the file once it is
                # loaded): that namespace's tables cannot be watched.
                if os.path.exists(path):
                    return None
            elif os.pread(fd, 4096, 0).strip():
                return None  # legacy tables: their rules have no version
        generation = self._generation()
        return None if generation is None else (generation,)

    def _generation(self) -> int | None:
        """nf_tables's generation, or None (no nf_tables in this kernel, or the request failed)."""
        self._sequence += 1
        request = _HEADER.pack(
            _HEADER.size + _NFGENMSG.size,
            (_NFNL_SUBSYS_NFTABLES << 8) | _NFT_MSG_GETGEN,
            _NLM_F_REQUEST,
            self._sequence,
            0,
        ) + _NFGENMSG.pack(socket.AF_UNSPEC, 0, 0)
        try:
            self._socket.send(request)
            while True:  # a reply left over from a request that failed half-way is skipped by its number
                reply = self._socket.recv(4096)
                if len(reply) < _HEADER.size + _NFGENMSG.size:
                    return None
                length, kind, _flags, sequence, _pid = _HEADER.unpack_from(reply)
                if sequence == self._sequence:
                    break
        except OSError:  # a timeout included
            return None
        if kind == _NLMSG_ERROR or kind != (_NFNL_SUBSYS_NFTABLES << 8) | _NFT_MSG_NEWGEN:
            return None
        offset = _HEADER.size + _NFGENMSG.size
        while offset + _ATTRIBUTE.size <= min(length, len(reply)):
            size, attribute = _ATTRIBUTE.unpack_from(reply, offset)
            if size < _ATTRIBUTE.size:
                return None
            if attribute & 0x7FFF == _NFTA_GEN_ID and size >= _ATTRIBUTE.size + 4:
                return int(struct.unpack_from(">I", reply, offset + _ATTRIBUTE.size)[0])
            offset += (size + 3) & ~3
        return None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._socket.close()
        for fd in self._legacy:
            if fd is not None:
                os.close(fd)


def _open_or_none(path: str) -> int | None:
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
