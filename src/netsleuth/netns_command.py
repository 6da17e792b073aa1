"""A shell command as a person types it to act inside a network namespace: the one place every printed fix
(doctor findings, diagnose verdicts, reset checks) is given its namespace, so what is printed can be pasted.

The forms are iproute2's and util-linux's:
- `ip -n NS ...` for `ip` itself (iproute2 ip(8) `-netns`);
- `ip netns exec NS CMD` for anything else; it also remounts /sys for the namespace (iproute2
  lib/namespace.c netns_switch), so `/sys/class/net/DEV` paths name the namespace's devices;
- `ip netns exec NS sh -c '...'` when the command has shell syntax: a redirection such as
  `echo 0 > /sys/...` would otherwise be opened by the *calling* shell, in the host's namespace;
- `nsenter --net=PATH` for a namespace given as a file (/proc/PID/ns/net) that has no `ip netns` name; when
  the command touches /sys it runs under `unshare -m` with sysfs mounted afresh, as `ip netns exec` does;
- `netsleuth SUB ... --netns NS` for our own commands.

Settings that exist once per host are left alone: a per-namespace copy of them does not exist (or is
read-only), so the host-wide command is the one that works.
"""

from __future__ import annotations

import re
import shlex

__all__ = ["HOST_WIDE_SYSCTLS", "in_netns", "is_host_wide_sysctl", "is_placed"]

# Sysctls the kernel keeps once for the whole host, that netsleuth's fixes may name. net/core/
# sysctl_net_core.c registers `net_core_table` for init_net only (netns_core_table is the per-namespace
# part); net/netfilter/nf_conntrack_standalone.c makes nf_conntrack_max read-only outside init_net.
HOST_WIDE_SYSCTLS = frozenset(
    {
        "net.core.netdev_max_backlog",
        "net.core.netdev_budget",
        "net.core.netdev_budget_usecs",
        "net.core.dev_weight",
        "net.core.flow_limit_table_len",
        "net.core.rps_sock_flow_entries",
        "net.netfilter.nf_conntrack_max",
        "net.nf_conntrack_max",
    }
)

_SHELL_SYNTAX = re.compile(r"[<>|;&`$()]")
_COMMENT = re.compile(r"\s+#\s")


def is_host_wide_sysctl(key: str) -> bool:
    return key.replace("/", ".") in HOST_WIDE_SYSCTLS


def _split_comment(command: str) -> tuple[str, str]:
    """`cmd   # why` -> ("cmd", "   # why"): the comment stays a comment after the command is wrapped."""
    match = _COMMENT.search(command)
    if match is None:
        return command, ""
    return command[: match.start()], command[match.start() :]


def is_placed(command: str) -> bool:
    """True when the command already says which namespace it runs in (so wrapping it again would break it)."""
    words = command.split()
    if words[:2] in (["ip", "-n"], ["ip", "-netns"], ["ip", "netns"]) or words[:1] == ["nsenter"]:
        return True
    return words[:1] == ["netsleuth"] and "--netns" in words


def _sysctl_keys(words: list[str]) -> list[str]:
    return [word.split("=", 1)[0] for word in words[1:] if not word.startswith("-")]


def _wrap(body: str, netns: str) -> str:
    words = body.split()
    if words[0] == "netsleuth":
        return f"{body} --netns {shlex.quote(netns)}"
    if words[0] == "sysctl" and all(is_host_wide_sysctl(key) for key in _sysctl_keys(words)):
        return body
    shell = bool(_SHELL_SYNTAX.search(body))
    if "/" not in netns:
        if words[0] == "ip" and not shell:
            return f"ip -n {shlex.quote(netns)} {body[len('ip') :].lstrip()}"
        inner = f"sh -c {shlex.quote(body)}" if shell else body
        return f"ip netns exec {shlex.quote(netns)} {inner}"
    enter = f"nsenter --net={shlex.quote(netns)}"
    if "/sys/" in body:
        # sysfs shows the namespace of whoever mounted it: mount it afresh in a private mount namespace.
        return f"{enter} unshare -m sh -c {shlex.quote('mount -t sysfs sysfs /sys && ' + body)}"
    return f"{enter} sh -c {shlex.quote(body)}" if shell else f"{enter} {body}"


def in_netns(command: str, netns: str | None) -> str:
    """`command` as typed to run it in `netns` (an `ip netns` name or a namespace file); unchanged when netns
    is None, when the command already names its namespace, or when it changes a host-wide setting."""
    if not netns:
        return command
    body, comment = _split_comment(command)
    if not body.strip() or is_placed(body):
        return command
    return _wrap(body.strip(), netns) + comment
