"""Which interrupts belong to which NIC, and which of those serve packet queues.

There is no single kernel file mapping a netdev queue to its IRQ on every driver (netdev genetlink
`napi-get` has it only for drivers that register NAPI IRQs, 6.8+), so two clues are joined: the device's
MSI vectors (/sys/bus/pci/devices/*/msi_irqs) and the handler names drivers give their vectors in
/proc/interrupts ("eth0-TxRx-3", "virtio2-input.0", "mlx5_comp3@pci:0000:03:00.0").
"""

from __future__ import annotations

import re

from netsleuth.doctor.model import DeviceSysfs, EthtoolRecord, InterruptLine

__all__ = ["device_irqs", "queue_irqs", "rx_queue_irqs"]

# Vectors that carry no packets: config/link-state/mailbox/async command interrupts.
_CONTROL_VECTOR = re.compile(r"(config|async|lsc|misc|ctrl|event|mbx|mailbox|pages|cmd|other|-fw)", re.I)
_QUEUE_VECTOR = re.compile(r"(rx|tx|input|output|comp|queue|fp|ch|\d)", re.I)
# Transmit-only vectors ("virtio2-output.0", "eth0-tx-3"); "TxRx" and "comp" vectors also receive.
_TX_NAME = re.compile(r"(output|tx)", re.I)
_RX_NAME = re.compile(r"(input|rx|comp|fp|queue)", re.I)


def _device_suffix(actions: str, prefixes: list[str], bus_info: str | None) -> str | None:
    """What follows the device's name in the handler ("-TxRx-3", "-input.0", "" for a bare name), or None
    when the handler does not belong to the device."""
    for handler in actions.split(","):
        handler = handler.strip()
        if bus_info and bus_info in handler:
            return handler
        for prefix in prefixes:
            if handler == prefix or handler.startswith((f"{prefix}-", f"{prefix}_", f"{prefix}@")):
                return handler[len(prefix) :]
    return None


def _prefixes(name: str, device: DeviceSysfs | None) -> list[str]:
    prefixes = [name]
    if device is not None and device.device_name and not device.device_name.startswith("0000:"):
        prefixes.append(device.device_name)  # "virtio2": the virtio bus device names the vectors
    return prefixes


def device_irqs(
    name: str, device: DeviceSysfs | None, ethtool: EthtoolRecord | None, interrupts: dict[int, InterruptLine]
) -> list[int]:
    prefixes = _prefixes(name, device)
    msi = set(device.msi_irqs) if device is not None else set()
    bus_info = ethtool.bus_info if ethtool is not None else None
    return sorted(
        irq
        for irq, line in interrupts.items()
        if irq in msi or _device_suffix(line.actions, prefixes, bus_info) is not None
    )


def queue_irqs(
    name: str, device: DeviceSysfs | None, ethtool: EthtoolRecord | None, interrupts: dict[int, InterruptLine]
) -> list[int]:
    prefixes = _prefixes(name, device)
    bus_info = ethtool.bus_info if ethtool is not None else None
    candidates = device_irqs(name, device, ethtool, interrupts)
    queues: list[int] = []
    bare: list[int] = []
    for irq in candidates:
        actions = interrupts[irq].actions
        suffix = _device_suffix(actions, prefixes, bus_info)
        if suffix is None:  # an MSI vector with a foreign name: judge the whole handler
            suffix = actions
        if _CONTROL_VECTOR.search(suffix):
            continue
        if suffix == "":
            bare.append(irq)
        elif _QUEUE_VECTOR.search(suffix):
            queues.append(irq)
    # A vector named just "eth0" is the link/other vector when named queue vectors exist (ixgbe, igb), and
    # the only vector of a single-vector NIC (e1000) otherwise.
    return queues if queues else bare


def rx_queue_irqs(
    name: str, device: DeviceSysfs | None, ethtool: EthtoolRecord | None, interrupts: dict[int, InterruptLine]
) -> list[int]:
    """Queue IRQs that carry received packets (everything but transmit-only vectors)."""
    return [
        irq
        for irq in queue_irqs(name, device, ethtool, interrupts)
        if _RX_NAME.search(interrupts[irq].actions) or not _TX_NAME.search(interrupts[irq].actions)
    ]
