"""fill_filter_config: the shared filter fields land in every program's config struct alike."""

from __future__ import annotations

import ipaddress

import msgspec
import pytest

from netsleuth._generated.dns_abi import DnsConfigC
from netsleuth._generated.drops_abi import DropsConfigC
from netsleuth._generated.route_abi import RouteConfigC
from netsleuth._generated.tcp_abi import TcpConfigC
from netsleuth.bpf.errors import BpfError
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
        fill_filter_config(
            cfg, FILTER if struct is not TcpConfigC else msgspec.structs.replace(FILTER, dev=None), ("proto",)
        )
        assert (cfg.netns, cfg.pid, cfg.comm) == (4026531840, 42, b"dig")
        assert (cfg.port, cfg.sport, cfg.dport) == (53, 0, 5353)
        assert (cfg.filter_host, cfg.filter_src, cfg.filter_dst, cfg.filter_owner) == (1, 0, 0, 1)


def test_proto_and_dev_are_written_where_the_struct_has_them() -> None:
    dns = DnsConfigC()
    fill_filter_config(dns, FILTER)
    assert (dns.family, dns.filter_l4proto, dns.l4proto, dns.filter_dev, dns.dev) == (4, 1, 17, 1, b"veth0")
    tcp = TcpConfigC()  # tcp sees TCP only: --proto tcp is what the object is, and it has no --dev
    fill_filter_config(tcp, msgspec.structs.replace(FILTER, proto=6, dev=None), inherent=("proto",))
    assert (tcp.netns, tcp.port, tcp.family) == (4026531840, 53, 4)


def test_a_filter_the_struct_has_no_field_for_is_refused() -> None:
    # tcp_config has no dev: a --dev reaching it would be a filter silently left open.
    with pytest.raises(
        BpfError, match=r"struct tcp_config has no filter_dev, dev: the filter cannot be applied"
    ):
        fill_filter_config(TcpConfigC(), msgspec.structs.replace(FILTER, proto=None))
    with pytest.raises(BpfError, match=r"struct tcp_config has no filter_l4proto, l4proto"):
        fill_filter_config(TcpConfigC(), msgspec.structs.replace(FILTER, dev=None))


def test_no_filter_is_all_zero() -> None:
    cfg = DropsConfigC()
    fill_filter_config(cfg, PacketFilter())
    assert bytes(cfg) == bytes(DropsConfigC())


def test_a_long_multibyte_name_is_cut_to_the_kernels_15_bytes() -> None:
    cfg = DnsConfigC()
    fill_filter_config(cfg, PacketFilter(comm="é" * 15))
    assert cfg.comm == ("é" * 15).encode()[:15]
