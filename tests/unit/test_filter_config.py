"""fill_filter_config: the shared filter fields land in every program's config struct alike."""

from __future__ import annotations

import ipaddress

from netsleuth._generated.dns_abi import DnsConfigC
from netsleuth._generated.drops_abi import DropsConfigC
from netsleuth._generated.route_abi import RouteConfigC
from netsleuth._generated.tcp_abi import TcpConfigC
from netsleuth.diagnostics.filter_maps import fill_filter_config
from netsleuth.diagnostics.filters import PacketFilter

FILTER = PacketFilter(
    proto=17,
    hosts=(ipaddress.ip_network("198.18.0.0/15"),),
    port=53,
    dport=5353,
    pid=42,
    comm="dig",
    netns=4026531840,
    dev="veth0",
    family=4,
)


def test_every_config_gets_the_same_values() -> None:
    for struct in (DnsConfigC, DropsConfigC, RouteConfigC, TcpConfigC):
        cfg = struct()
        fill_filter_config(cfg, FILTER)
        assert (cfg.netns, cfg.pid, cfg.comm) == (4026531840, 42, b"dig")
        assert (cfg.port, cfg.sport, cfg.dport) == (53, 0, 5353)
        assert (cfg.filter_host, cfg.filter_src, cfg.filter_dst, cfg.filter_owner) == (1, 0, 0, 1)


def test_only_declared_fields_are_set() -> None:
    dns = DnsConfigC()
    fill_filter_config(dns, FILTER)
    assert (dns.family, dns.filter_l4proto, dns.l4proto, dns.filter_dev, dns.dev) == (4, 1, 17, 1, b"veth0")
    tcp = TcpConfigC()
    fill_filter_config(tcp, FILTER)  # tcp has no proto or device field: its config reader refuses those
    assert not hasattr(tcp, "l4proto") and not hasattr(tcp, "dev")


def test_no_filter_is_all_zero() -> None:
    cfg = DropsConfigC()
    fill_filter_config(cfg, PacketFilter())
    assert bytes(cfg) == bytes(DropsConfigC())


def test_a_long_multibyte_name_is_cut_to_the_kernels_15_bytes() -> None:
    cfg = DnsConfigC()
    fill_filter_config(cfg, PacketFilter(comm="é" * 15))
    assert cfg.comm == ("é" * 15).encode()[:15]
