"""Which iptables/nftables rule dropped a packet.

`hook_from_stack` turns the drop's kernel stack into the netfilter hook; a `FirewallMatcher`, created per
network namespace when a trace starts, replays the packet through that hook's chains and names the rule:

    matcher = FirewallMatcher("/run/netns/blue")
    verdict = matcher.explain(packet, hook_from_stack(frames, packet.family), "eth0", None)
    if verdict:
        print(verdict.rule)   # -A INPUT -p udp -m udp --dport 9 -j DROP

All reading is read-only and happens inside the namespace (`run_in_netns`, reusable by other modules).
"""

from netsleuth.firewall.hooks import HOOKS, hook_from_stack
from netsleuth.firewall.matcher import (
    Confidence,
    FirewallMatcher,
    FirewallSnapshot,
    FirewallVerdict,
    read_snapshot,
)
from netsleuth.kernel.netns_exec import CommandFailed, read_file_in_netns, run_in_netns

__all__ = [
    "HOOKS",
    "CommandFailed",
    "Confidence",
    "FirewallMatcher",
    "FirewallSnapshot",
    "FirewallVerdict",
    "hook_from_stack",
    "read_file_in_netns",
    "read_snapshot",
    "run_in_netns",
]
