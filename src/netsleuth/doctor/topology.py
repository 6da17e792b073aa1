"""Which interrupts belong to which NIC, and which of those serve packet queues.

There is no single kernel file mapping a netdev queue to its IRQ on every driver (netdev genetlink
`napi-get` has it only for drivers that register NAPI IRQs, 6.8+), so two clues are joined: the device's
MSI vectors (/sys/bus/pci/devices/*/msi_irqs) and the handler names drivers give their vectors in
/proc/interrupts ("eth0-TxRx-3", "virtio2-input.0", "mlx5_comp3@pci:0000:03:00.0").
"""

from __future__ import annotations

import re

from netsleuth.doctor.model import DeviceSysfs, EthtoolRecord, InterruptLine

__all__ = ["device_irqs", "queue_irqs"]

# Vectors that carry no packets: config/link-state/mailbox/async command interrupts.
_CONTROL_VECTOR = re.compile(r"(config|async|lsc|misc|ctrl|event|mbx|mailbox|pages|cmd|other|-fw)", re.I)
_QUEUE_VECTOR = re.compile(r"(rx|tx|input|output|comp|queue|fp|ch|\d)", re.I)


def _names_device(actions: str, prefixes: list[str], bus_info: str | None) -> bool:
    for handler in actions.split(","):
        handler = handler.strip()
        if bus_info and bus_info in handler:
            return True
        for prefix in prefixes:
            if handler == prefix or handler.startswith((f"{prefix}-", f"{prefix}_", f"{prefix}@")):
                return True
    return False


def device_irqs(
    name: str, device: DeviceSysfs | None, ethtool: EthtoolRecord | None, interrupts: dict[int, InterruptLine]
) -> list[int]:
    prefixes = [name]
    if device is not None and device.device_name and not device.device_name.startswith("0000:"):
        prefixes.append(device.device_name)  # "virtio2": the virtio bus device names the vectors
    msi = set(device.msi_irqs) if device is not None else set()
    bus_info = ethtool.bus_info if ethtool is not None else None
    return sorted(
        irq for irq, line in interrupts.items() if irq in msi or _names_device(line.actions, prefixes, bus_info)
    )


def queue_irqs(
    name: str, device: DeviceSysfs | None, ethtool: EthtoolRecord | None, interrupts: dict[int, InterruptLine]
) -> list[int]:
    return [
        irq
        for irq in device_irqs(name, device, ethtool, interrupts)
        if not _CONTROL_VECTOR.search(interrupts[irq].actions) and _QUEUE_VECTOR.search(interrupts[irq].actions)
    ]
