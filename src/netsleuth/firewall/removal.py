"""The command that removes the rule a drop was matched to, as a person types it: by the rule's number with
the iptables flavour that listed it, or by the nftables handle. One place for every verdict that offers it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from netsleuth.netns_command import in_netns

__all__ = ["removal_command"]


def removal_command(netfilter: Mapping[str, Any], netns: str | None) -> str | None:
    """`iptables -t filter -D INPUT 1` (in `netns`), `nft delete rule ... handle N`, or None when the
    record does not say enough (no rule number, no handle)."""
    table, chain = netfilter.get("table"), netfilter.get("chain")
    backend = str(netfilter.get("backend") or "")
    if backend.startswith("iptables") and netfilter.get("rule_number") is not None:
        tool = "ip6tables" if netfilter.get("family") == "ip6" else "iptables"
        if backend == "iptables-legacy":
            tool += "-legacy"
        return in_netns(f"{tool} -t {table} -D {chain} {netfilter['rule_number']}", netns)
    if netfilter.get("handle") is not None:
        command = f"nft delete rule {netfilter.get('family')} {table} {chain} handle {netfilter['handle']}"
        return in_netns(command, netns)
    return None
