"""hook_from_stack: the netfilter hook of a drop, from the function that called nf_hook_slow()."""

from __future__ import annotations

import pytest

from netsleuth.firewall.hooks import all_of, hook_from_stack

DROP = ["sk_skb_reason_drop", "kfree_skb_reason", "nf_hook_slow"]


@pytest.mark.parametrize(
    ("callers", "family", "hook"),
    [
        (["__ip_local_out", "ip_local_out", "ip_send_skb", "udp_send_skb"], 4, "output"),
        (["__ip6_local_out", "ip6_local_out", "ip6_send_skb", "udp_v6_send_skb"], 6, "output"),
        (["ip6_xmit", "inet6_csk_xmit", "__tcp_transmit_skb"], 6, "output"),
        (["raw_send_hdrinc", "raw_sendmsg"], 4, "output"),
        (["ndisc_send_skb", "ndisc_send_ns"], 6, "output"),
        (["ip_rcv", "__netif_receive_skb_one_core"], 4, "prerouting"),
        (["ipv6_rcv", "__netif_receive_skb_one_core"], 6, "prerouting"),
        # NF_HOOK_LIST: nf_hook_slow_list sits between, and the caller may carry a compiler suffix.
        (["nf_hook_slow_list", "ip_sublist_rcv.constprop.0", "ip_list_rcv"], 4, "prerouting"),
        (["ip_local_deliver", "ip_sublist_rcv_finish", "ip_list_rcv"], 4, "input"),
        (["ip6_input", "ip6_sublist_rcv_finish"], 6, "input"),
        (["ip_forward", "ip_sublist_rcv_finish"], 4, "forward"),
        (["ip6_forward", "ip6_rcv_finish"], 6, "forward"),
        (["ip_output", "ip_local_out", "ip_send_skb"], 4, "postrouting"),
        (["ip6_output", "ip6_local_out"], 6, "postrouting"),
        # Symbolized frames with offsets and module tags.
        (["ip_local_deliver+0x7a/0x110 [kernel]", "ip_rcv+0x1d/0xc0"], 4, "input"),
    ],
)
def test_caller_of_nf_hook_slow_names_the_hook(callers: list[str], family: int, hook: str) -> None:
    assert hook_from_stack([*DROP, *callers], family) == hook


def test_inlined_local_out_is_recognised_by_the_output_path_below_it() -> None:
    # __ip_local_out/ip_local_out inlined away: the first named frame is ip_send_skb.
    assert hook_from_stack([*DROP, "ip_send_skb", "udp_send_skb", "udp_sendmsg"], 4) == "output"


def test_reset_sent_while_receiving_is_output_not_input() -> None:
    # A TCP reset sent from the receive path: input functions sit below the output hook.
    frames = [*DROP, "ip_push_pending_frames", "ip_send_unicast_reply", "tcp_v4_send_reset", "tcp_v4_rcv",
              "ip_protocol_deliver_rcu", "ip_local_deliver_finish", "ip_local_deliver"]  # fmt: skip
    assert hook_from_stack(frames, 4) == "output"


@pytest.mark.parametrize(
    ("callers", "hook"),
    [
        (["br_pass_frame_up", "br_handle_frame_finish"], "bridge-input"),
        (["__br_forward", "br_forward", "br_handle_frame_finish"], "bridge-forward"),
        (["__br_forward", "br_flood", "br_dev_xmit", "dev_hard_start_xmit"], "bridge-output"),
        (["br_forward_finish", "__br_forward"], "bridge-postrouting"),
        (["br_nf_hook_thresh", "br_nf_pre_routing_finish"], "bridge-prerouting"),
        # br_netfilter runs the IP-family hooks for bridged IP packets: iptables PREROUTING sees them.
        (["br_nf_pre_routing", "br_handle_frame"], "prerouting"),
        (["br_nf_forward_ip", "__br_forward"], "forward"),
        (["__netif_receive_skb_core.constprop.0", "__netif_receive_skb_one_core"], "ingress"),
        (["__dev_queue_xmit", "ip_finish_output2"], "egress"),
    ],
)
def test_bridge_and_netdev_hooks(callers: list[str], hook: str) -> None:
    assert hook_from_stack([*DROP, *callers], 4) == hook


def test_non_ip_packets_only_get_non_ip_hooks() -> None:
    assert hook_from_stack([*DROP, "ip_rcv"], 0) is None
    assert hook_from_stack([*DROP, "br_pass_frame_up"], 0) == "bridge-input"


@pytest.mark.parametrize(
    "frames",
    [
        ["kfree_skb_reason", "tcp_v4_rcv", "ip_local_deliver"],  # not a netfilter drop
        [*DROP, "some_module_function", "another", "and_another", "and_more", "ip_rcv"],  # too deep
        [*DROP],
        [],
    ],
)
def test_unknown_stacks_give_none(frames: list[str]) -> None:
    assert hook_from_stack(frames, 4) is None


def test_all_of_is_three_valued() -> None:
    assert all_of([True, True]) is True
    assert all_of([True, None]) is None
    assert all_of([None, False]) is False
    assert all_of([]) is True
