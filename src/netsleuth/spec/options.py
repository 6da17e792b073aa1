"""What a config field says about itself beyond its type: help, how the CLI spells it, how a form labels it.

A diagnostic's config is one msgspec Struct; each field is `Annotated[<type>, <constraints>, Opt(...)]`.
msgspec reads the type and the constraints (`msgspec.Meta(ge=1, le=65535)`) for validation and JSON Schema;
everything else netsleuth derives from the field - the CLI flag, the form field, the error sentences - reads
the `Opt`. Nothing about a field is written twice.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Literal, TypeAlias

import msgspec
from msgspec import Meta

__all__ = [
    "FILTERS",
    "NETWORK_TYPES",
    "Comm",
    "Ifname",
    "IpNetwork",
    "K8sNamespace",
    "NetnsRef",
    "Opt",
    "Pid",
    "PodName",
    "Port",
    "Proto",
    "Sample",
    "Seconds",
    "SoftirqName",
]

FILTERS = "filters (applied in the kernel)"


class Opt(msgspec.Struct, frozen=True):
    """How one config field reads outside Python.

    `help` is the CLI's help and the form's hint; `label` the form's label (default: the field name in words);
    `flag` the CLI spelling when it is not `--field-name`; `consts` extra flags that each store one value
    (`{"-4": 4, "-6": 6}` for `family`); `metavar` the CLI's placeholder; `group` the --help section and the
    form's fieldset; `positional` a CLI argument without a dash; `cli`/`form` whether the field is offered
    there at all (a field may be JSON-only, e.g. set by the fleet's scope)."""

    help: str
    label: str | None = None
    flag: str | None = None
    consts: Mapping[str, object] = msgspec.field(default_factory=dict)
    metavar: str | None = None
    group: str | None = None
    positional: bool = False
    cli: bool = True
    form: bool = True

    def flag_for(self, name: str) -> str:
        return self.flag or "--" + name.replace("_", "-")

    def label_for(self, name: str) -> str:
        return self.label or name.replace("_", " ")


if TYPE_CHECKING:
    IpNetwork: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network
else:
    # msgspec takes at most one custom type in a union, so at run time a field of this type is the two
    # classes' common base; the decoders (spec.configs, spec.records) build the IPv4Network or IPv6Network
    # the text is.
    IpNetwork = ipaddress._BaseNetwork
# Every class a network field's type may be, as msgspec reports it (decoders and schemas test against these).
NETWORK_TYPES: tuple[type, ...] = (ipaddress._BaseNetwork, ipaddress.IPv4Network, ipaddress.IPv6Network)

# Reusable field types: the constraint is part of the type, so every diagnostic checks a port the same way;
# `words` is how an error names what was expected ("--dport 70000 is not a port: ...").
Port = Annotated[int, Meta(ge=1, le=65535, extra={"words": "a port: give a number from 1 to 65535"})]
Pid = Annotated[int, Meta(ge=1, extra={"words": "a process id"})]
# TASK_COMM_LEN - 1: the kernel keeps 15 characters of a task's name.
Comm = Annotated[
    str,
    Meta(
        min_length=1, max_length=15, extra={"words": "a name of 1 to 15 characters, as the kernel keeps it"}
    ),
]
# IFNAMSIZ - 1: an interface name the kernel can hold.
Ifname = Annotated[
    str, Meta(min_length=1, max_length=15, extra={"words": "an interface name (1 to 15 characters)"})
]
Seconds = Annotated[float, Meta(gt=0, extra={"words": "a positive number of seconds"})]
Sample = Annotated[int, Meta(ge=1, extra={"words": "a sample rate: 1 (every event) or more"})]
# A network namespace as a person names it: an `ip netns` name, an inode, or a /proc/PID/ns/net path. It is
# resolved to an inode on the host that runs the diagnostic (netsleuth.spec.scope.Netns), never before.
NetnsRef = Annotated[str, Meta(min_length=1, extra={"words": "a network namespace"})]
Proto = Literal["tcp", "udp", "icmp", "icmpv6", "sctp"] | Annotated[int, Meta(ge=0, le=255)]
# A Kubernetes pod or namespace on the host that runs the diagnostic (its pods' network namespaces), resolved
# there through the container runtime (netsleuth.kernel.pods) like a NetnsRef; only the form is checked here.
PodName = Annotated[
    str, Meta(pattern=r"^[^/\s]+/[^/\s]+$", extra={"words": "a pod as NAMESPACE/NAME (e.g. team-a/web-1)"})
]
K8sNamespace = Annotated[
    str, Meta(pattern=r"^[^/\s]+$", extra={"words": "a Kubernetes namespace name (e.g. team-a)"})
]
# A softirq vector as /proc/softirqs names it (NET_RX, TIMER...; any case): checked against the vectors of the
# kernel that runs the diagnostic when it opens (netsleuth.kernel.softirqs).
SoftirqName = Annotated[str, Meta(pattern=r"^[A-Za-z_]+$", extra={"words": "a softirq name (e.g. NET_RX)"})]
