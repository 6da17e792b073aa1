"""The OCI image (packaging/image/build.py), run with podman the way docs/kubernetes.md says to run it: the
host's pid and network namespaces, every capability dropped but the few the agent uses, a seccomp profile
that is podman's default plus bpf()/perf_event_open() for CAP_BPF/CAP_PERFMON (packaging/image/
seccomp_profile.py), a read-only root, BTF and the named namespaces mounted read-only. It sees a real
firewall drop in a test namespace; each capability it is given is shown to be needed by running without it.

The image is built once per content (cached in /var/cache/netsleuth-image: the Debian layer for a week, the
netsleuth layer until what goes into the wheel changes), so a run whose code did not change only loads it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.netlab import wait_for
from tests.privileged.conftest import Pair

REPO = Path(__file__).resolve().parents[2]
# The least that works for `drops` (each one's reason: docs/kubernetes.md).
CAPABILITIES = ("CAP_BPF", "CAP_PERFMON", "CAP_NET_ADMIN", "CAP_SYSLOG")
# This machine's root lacks CAP_SYS_RESOURCE, so podman may not raise its limits above ours: state them.
ULIMITS = ("--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096")
TCP_CONNECT = (
    "import socket,sys\ns=socket.socket()\ns.settimeout(0.5)\n"
    "try: s.connect((sys.argv[1], int(sys.argv[2])))\nexcept OSError: pass\n"
)


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    built = subprocess.run(
        [sys.executable, str(REPO / "packaging/image/build.py")], capture_output=True, text=True, timeout=1500
    )
    assert built.returncode == 0, built.stderr[-3000:]
    layout_ref = built.stdout.strip().splitlines()[-1]
    tag = layout_ref.rsplit(":", 1)[1]
    name = f"localhost/netsleuth:{tag}"
    if subprocess.run(["podman", "image", "exists", name]).returncode != 0:
        image_id = subprocess.run(
            ["podman", "pull", "-q", layout_ref], check=True, capture_output=True, text=True, timeout=600
        ).stdout.strip()
        subprocess.run(["podman", "tag", image_id, name], check=True, capture_output=True)
    # Older builds of the image: only the newest is kept in podman's storage.
    listed = subprocess.run(
        ["podman", "images", "--format", "{{.Repository}}:{{.Tag}}", "localhost/netsleuth"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for old in set(listed) - {name}:
        subprocess.run(["podman", "rmi", "-f", old], capture_output=True)
    yield name


@pytest.fixture(scope="module")
def seccomp_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("seccomp") / "netsleuth.json"
    with path.open("w") as out:
        subprocess.run(
            [sys.executable, str(REPO / "packaging/image/seccomp_profile.py")], stdout=out, check=True
        )
    return path


def podman_argv(
    image: str, seccomp: Path | None, capabilities: tuple[str, ...], mounts: list[str], *argv: str
) -> list[str]:
    security = ["--security-opt", f"seccomp={seccomp}"] if seccomp else []
    return [
        "podman", "run", "--rm", *ULIMITS, "--pid=host", "--network=host", "--read-only",
        "--cap-drop=all", f"--cap-add={','.join(capabilities)}", *security,
        "-v", "/sys/kernel/btf:/sys/kernel/btf:ro", "-v", "/run/netns:/run/netns:ro",
        *(part for mount in mounts for part in ("-v", mount)),
        image, *argv,
    ]  # fmt: skip


def run_drops(
    image: str, seccomp: Path | None, capabilities: tuple[str, ...], pair: Pair, tmp_path: Path
) -> tuple[list[dict[str, Any]], str, int]:
    """`netsleuth drops` in the container on pair.b's namespace while pair.a connects to a port b drops."""
    ready = tmp_path / "ready"
    ready.unlink(missing_ok=True)
    argv = podman_argv(
        image, seccomp, capabilities, [f"{tmp_path}:/out"],
        "drops", "--netns", str(pair.b.inode), "--json", "--duration", "60", "--ready-file", "/out/ready",
    )  # fmt: skip
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as container:
        try:
            wait_for(
                lambda: ready.exists() or container.poll() is not None, timeout=120, what="the container"
            )
            if ready.exists():
                for _ in range(3):
                    pair.a.run(sys.executable, "-c", TCP_CONNECT, pair.b4, "8080")
                # The records are read once it ends: SIGINT (podman passes it on) ends it with its summary.
                container.send_signal(2)
            stdout, stderr = container.communicate(timeout=120)
        finally:
            if container.poll() is None:
                container.kill()
    records = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return records, stderr, container.returncode


def test_the_image_holds_no_compiler_and_no_headers(image: str, tmp_path: Path) -> None:
    archive = tmp_path / "image.tar"
    subprocess.run(["podman", "save", "--format", "docker-archive", "-o", str(archive), image], check=True)
    names: set[str] = set()
    with tarfile.open(archive) as outer:
        for member in outer.getmembers():
            if member.name.endswith(".tar") or member.name.endswith("/layer.tar"):
                layer = outer.extractfile(member)
                assert layer is not None
                with tarfile.open(fileobj=layer) as inner:
                    names |= {name.removeprefix("./") for name in inner.getnames()}
    assert "usr/lib/x86_64-linux-gnu/libbpf.so.1" in names or "usr/lib/aarch64-linux-gnu/libbpf.so.1" in names
    assert "usr/local/bin/netsleuth" in names and "usr/bin/python3" in names
    compilers = {"usr/bin/gcc", "usr/bin/cc", "usr/bin/clang", "usr/bin/as", "usr/bin/ld", "usr/bin/cpp"}
    assert not names & compilers
    assert not [name for name in names if name.endswith(".h")], "headers in the image"
    size = int(subprocess.run(["podman", "image", "inspect", "--format", "{{.Size}}", image],
                              capture_output=True, text=True, check=True).stdout)  # fmt: skip
    assert size < 250_000_000, size


def test_the_image_sees_a_real_drop_with_the_least_capabilities(
    image: str, seccomp_profile: Path, pair: Pair, tmp_path: Path
) -> None:
    pair.b.run("iptables", "-A", "INPUT", "-p", "tcp", "--dport", "8080", "-j", "DROP")
    records, stderr, returncode = run_drops(image, seccomp_profile, CAPABILITIES, pair, tmp_path)
    assert returncode in (0, 130), stderr
    drops = [r for r in records if r.get("type") == "drop" and r.get("dport") == 8080]
    assert len(drops) >= 3, (records, stderr)
    drop = drops[0]
    assert drop["reason"] == "NETFILTER_DROP" and drop["daddr"] == pair.b4 and drop["saddr"] == pair.a4
    assert drop["netns"] == pair.b.inode and drop["netns_name"] == pair.b.name
    assert drop["location"].split("+")[0] in ("nf_hook_slow", "nft_do_chain", "ipt_do_table")
    # Reading the rules of another namespace means entering it (setns): CAP_SYS_ADMIN, not given here.
    assert drop["netfilter"] is None or drop["netfilter"].get("rule") is None
    assert "needs CAP_SYS_ADMIN" in stderr
    summary = records[-1]
    assert summary["type"] == "summary" and summary["total"] >= 3 and summary["lost"] == 0


def test_with_cap_sys_admin_the_rule_is_named(image: str, pair: Pair, tmp_path: Path) -> None:
    # CAP_SYS_ADMIN also satisfies podman's default seccomp profile, so none is given.
    pair.b.run("iptables", "-A", "INPUT", "-p", "tcp", "--dport", "8080", "-j", "DROP")
    records, stderr, _ = run_drops(image, None, (*CAPABILITIES, "CAP_SYS_ADMIN"), pair, tmp_path)
    drops = [r for r in records if r.get("type") == "drop" and r.get("dport") == 8080]
    assert drops, (records, stderr)
    assert drops[0]["netfilter"]["rule"] == "-A INPUT -p tcp -m tcp --dport 8080 -j DROP"


@pytest.mark.parametrize(
    ("missing", "sentence"),
    [
        ("CAP_BPF", "the kernel refused to load"),
        ("CAP_PERFMON", "the kernel refused to load"),
        ("CAP_SYSLOG", "/proc/kallsyms shows every kernel address as 0"),
        ("seccomp", "the kernel refused to load"),
    ],
)
def test_each_grant_is_needed(
    image: str, seccomp_profile: Path, pair: Pair, tmp_path: Path, missing: str, sentence: str
) -> None:
    capabilities = tuple(capability for capability in CAPABILITIES if capability != missing)
    profile = None if missing == "seccomp" else seccomp_profile
    result = subprocess.run(
        podman_argv(
            image, profile, capabilities, [], "drops", "--netns", str(pair.b.inode), "--duration", "1"
        ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert result.stderr.startswith("netsleuth: ") and sentence in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_the_controller_runs_from_the_image(image: str) -> None:
    # The image has the fleet, controller and cri extras: the controller gets as far as its configuration.
    result = subprocess.run(
        [
            "podman",
            "run",
            "--rm",
            *ULIMITS,
            "--network=none",
            image,
            "controller",
            "check",
            "--config",
            "/none",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "cannot read" in result.stderr, result.stderr
