"""The plug-in's config and records: what a user asks for and what each kill(2) reads as."""

from __future__ import annotations

from typing import Annotated

from netsleuth.spec.common import RunConfig
from netsleuth.spec.options import FILTERS, NetnsRef, Opt
from netsleuth.spec.records import Record, WallTime
from netsleuth.spec.scope import NetnsField, ScopeRole
from netsleuth.spec.summary import Summary

__all__ = ["SignalRecord", "SignalsConfig", "SignalsSummary"]


class SignalsConfig(RunConfig, frozen=True, kw_only=True):
    netns: Annotated[
        NetnsRef | None,
        Opt("the sender's network namespace: inode, `ip netns` name or file", label="network namespace",
            group=FILTERS),
    ] = None  # fmt: skip


class SignalRecord(Record, frozen=True, kw_only=True, tag="signal"):
    time: WallTime
    pid: int
    comm: str
    netns: NetnsField  # the sender's: the kernel filters by it
    target_pid: int
    signal: int
    # The target's namespace, looked up when the record is made (/proc/PID/ns/net): a fact joined from
    # outside the kernel filter, as conn's NAT lookups are. None when the target is gone or a group.
    target_netns: Annotated[int | None, ScopeRole("netns")]


class SignalsSummary(Summary, frozen=True, kw_only=True, tag="summary"):
    netns_filter: int | None  # the namespace inode the kernel filtered by: what the session was given
