"""A seccomp profile for the agent's container: the container runtime's own default profile plus bpf() for
CAP_BPF and perf_event_open() for CAP_PERFMON.

    .venv/bin/python packaging/image/seccomp_profile.py [DEFAULT] > netsleuth-seccomp.json
    (DEFAULT: containers-common's /usr/share/containers/seccomp.json, podman's default)

Why: the default profiles of podman (containers-common 0.50, Debian 12) and containerd 1.6 allow those two
calls only to a container holding CAP_SYS_ADMIN; they predate CAP_BPF and CAP_PERFMON (Linux 5.8), which
are exactly the capabilities the kernel checks for them. So without this, the agent needs either
CAP_SYS_ADMIN (far more than it uses) or no seccomp filter at all. With it, everything else the default
forbids stays forbidden. docs/kubernetes.md says how to install it as a Kubernetes Localhost profile.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

DEFAULT_PROFILE = Path("/usr/share/containers/seccomp.json")
# The calls CAP_BPF and CAP_PERFMON are for (kernel/bpf/syscall.c bpf_capable(), kernel/events/core.c
# perfmon_capable()); the kernel still checks the capability itself.
ALLOWED_BY_CAPABILITY = {"bpf": "CAP_BPF", "perf_event_open": "CAP_PERFMON"}


def agent_profile(default: dict[str, Any]) -> dict[str, Any]:
    profile: dict[str, Any] = json.loads(json.dumps(default))
    # The default's explicit refusal of these calls to containers without CAP_SYS_ADMIN would clash with
    # the rules added here (one call, two actions); its rule allowing them with CAP_SYS_ADMIN stays.
    kept = []
    for rule in profile["syscalls"]:
        if rule.get("action") != "SCMP_ACT_ALLOW":
            rule["names"] = [name for name in rule["names"] if name not in ALLOWED_BY_CAPABILITY]
        if rule["names"]:
            kept.append(rule)
    profile["syscalls"] = [
        *kept,
        *(
            {"names": [name], "action": "SCMP_ACT_ALLOW", "includes": {"caps": [capability]}}
            for name, capability in ALLOWED_BY_CAPABILITY.items()
        ),
    ]
    return profile


def main() -> int:
    source = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_PROFILE
    json.dump(agent_profile(json.loads(source.read_text())), sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
