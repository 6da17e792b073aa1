"""A container runtime of the test's own: Debian's containerd 1.6 with its CRI plugin, runc and CNI bridge
networking, everything under one temporary directory, and real pod sandboxes made through CRI.

    with CriLab.start(tmp_path) as cri:
        pod = cri.run_pod("team-a", "web-1", labels={"app": "web"})
        cri.run_container(pod, "sender", ["/pause", "198.19.7.3", "9"])  # a process in the pod's cgroup
        pod.popen(["python3", "-c", ...])  # a host binary in the pod's network namespace

- containerd runs with its own config, root, state and socket (so a containerd the machine may run is never
  touched), runc's state under the same directory, and a CNI conflist whose bridge (`nscri<pid>`) and
  addresses (198.19.<n>.0/24, n from the pid) are this process's;
- no registry is reachable, so the pause image is built here: tests/fixtures/cri/pause.c compiled with
  `gcc -static`, made an OCI image with umoci and imported with `ctr -n k8s.io images import`. The same image
  runs the test containers (the binary sends UDP datagrams when given an address);
- `close()` removes every container and sandbox of this containerd (it is ours alone, so all of them), stops
  it and any shim it left, deletes the bridge, the pods' cgroups and the directory, also after a failure.

Pods are put under the cgroup parent /netsleuth-cri-<pid>/pod<uid> (the kubelet's cgroupfs layout is
/kubepods/<qos>/pod<uid>), so their containers' cgroup paths carry the pod UID and container id as on a node.
The machine's root lacks CAP_SYS_RESOURCE, so the CRI plugin is told `restrict_oom_score_adj` (runc could not
give the sandbox the -998 it asks for otherwise).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from netsleuth.kernel.cri import ENDPOINT_VARIABLE, CriClient, CriError, SandboxDetail
from netsleuth.kernel.cri_wire import Fields, encode_map, encode_message, encode_string, encode_varint_field
from tests.netlab import run, wait_for

__all__ = ["IMAGE", "CriLab", "LabPod", "build_pause_image", "runtime_for_tests"]

REPO = Path(__file__).resolve().parents[1]
IMAGE = "netsleuth.test/pause:1"
_CNI_BIN = "/usr/lib/cni"
_CGROUP_ROOT = "/sys/fs/cgroup"


def build_pause_image(directory: Path) -> Path:
    """tests/fixtures/cri/pause.c as a static binary in a one-layer OCI image; the path of its archive."""
    binary = directory / "pause"
    run("gcc", "-static", "-Os", "-Wall", "-o", str(binary), str(REPO / "tests/fixtures/cri/pause.c"))
    layout, bundle = directory / "oci", directory / "bundle"
    run("umoci", "init", "--layout", str(layout))
    reference = f"{layout}:1"
    run("umoci", "new", "--image", reference)
    run("umoci", "unpack", "--image", reference, str(bundle))
    os.replace(binary, bundle / "rootfs" / "pause")
    run("umoci", "repack", "--image", reference, str(bundle))
    run("umoci", "config", "--image", reference, "--config.entrypoint", "/pause")
    run("umoci", "gc", "--layout", str(layout))
    archive = directory / "pause.tar"
    run("tar", "-C", str(layout), "-cf", str(archive), ".")
    return archive


@dataclass
class LabPod:
    """One pod sandbox made through CRI."""

    lab: CriLab
    sandbox_id: str
    namespace: str
    name: str
    uid: str
    labels: Mapping[str, str]
    config: bytes  # the encoded PodSandboxConfig (CreateContainer wants it again)
    detail: SandboxDetail
    containers: dict[str, str] = field(default_factory=dict)  # name -> container id

    @property
    def netns_path(self) -> str:
        assert self.detail.netns_path is not None
        return self.detail.netns_path

    @functools.cached_property
    def inode(self) -> int:
        """The namespace's inode (read once: it stays the record's number after the pod is gone)."""
        return os.stat(self.netns_path).st_ino

    @property
    def ip(self) -> str:
        return self.detail.ip

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    def argv(self, *argv: str) -> list[str]:
        """`argv` run from the host's filesystem inside the pod's network namespace (a sidecar's view)."""
        return ["nsenter", f"--net={self.netns_path}", "--", *argv]

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run(*self.argv(*argv), check=check)

    def popen(self, argv: Sequence[str], **kwargs: object) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self.argv(*argv), **kwargs)  # type: ignore[call-overload, no-any-return]


class CriLab:
    """One containerd under `directory`; see the module's docstring."""

    def __init__(self, directory: Path, image_archive: Path) -> None:
        self.directory = directory
        self.socket = str(directory / "containerd.sock")
        self.image_archive = image_archive
        pid = os.getpid()
        self.bridge = f"nscri{pid}"[:15]
        self.subnet_prefix = f"198.19.{16 + pid % 224}"
        self.cgroup_parent = f"/netsleuth-cri-{pid}"
        self.pods: list[LabPod] = []
        self._process: subprocess.Popen[bytes] | None = None
        self._client: CriClient | None = None

    @classmethod
    @contextlib.contextmanager
    def start(cls, image_archive: Path) -> Iterator[CriLab]:
        """A running containerd with the pause image imported; everything removed on exit."""
        directory = Path(tempfile.mkdtemp(prefix="nscri-"))
        lab = cls(directory, image_archive)
        try:
            lab._start()
            yield lab
        finally:
            lab.close()

    # -- set-up --------------------------------------------------------------------------------------------
    def _write_config(self) -> Path:
        base = self.directory
        for name in ("root", "state", "runc", "opt", "net.d", "ipam"):
            (base / name).mkdir()
        conflist = {
            "cniVersion": "1.0.0",
            "name": f"netsleuth-{self.bridge}",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    "isGateway": True,
                    "ipMasq": False,  # no NAT rules in the host's tables
                    "ipam": {
                        "type": "host-local",
                        "dataDir": str(base / "ipam"),
                        "ranges": [[{"subnet": f"{self.subnet_prefix}.0/24"}]],
                        "routes": [{"dst": "198.18.0.0/15"}],
                    },
                }
            ],
        }
        (base / "net.d" / "10-netsleuth.conflist").write_text(json.dumps(conflist))
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        config = f"""version = 2
root = "{base}/root"
state = "{base}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{self.socket}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{base}/opt"
[{cri}]
  sandbox_image = "{IMAGE}"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        Root = "{base}/runc"
        SystemdCgroup = false
  [{cri}.cni]
    bin_dir = "{_CNI_BIN}"
    conf_dir = "{base}/net.d"
    max_conf_num = 1
"""
        path = base / "config.toml"
        path.write_text(config)
        return path

    def _start(self) -> None:
        config = self._write_config()
        log = open(self.directory / "containerd.log", "wb")  # noqa: SIM115 - the process keeps it
        self._process = subprocess.Popen(
            ["containerd", "--config", str(config)], stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        wait_for(
            self._answers, timeout=30, what=f"containerd on {self.socket} ({self.directory}/containerd.log)"
        )
        run("ctr", "--address", self.socket, "-n", "k8s.io", "images", "import",
            "--base-name", IMAGE.rsplit(":", 1)[0], str(self.image_archive))  # fmt: skip

    def _answers(self) -> bool:
        if self._process is not None and self._process.poll() is not None:
            log = (self.directory / "containerd.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"containerd exited ({self._process.returncode}): {log}")
        if not os.path.exists(self.socket):
            return False
        try:
            self.client.version()
        except CriError:
            return False
        return True

    @property
    def client(self) -> CriClient:
        if self._client is None:
            self._client = CriClient(self.socket, timeout=60.0)
        return self._client

    @property
    def endpoint(self) -> str:
        return f"unix://{self.socket}"

    # -- pods and containers -------------------------------------------------------------------------------
    def run_pod(self, namespace: str, name: str, labels: Mapping[str, str] | None = None) -> LabPod:
        """RunPodSandbox with this Kubernetes namespace, pod name, a fresh UID and `labels`."""
        uid = str(uuid.uuid4())
        labels = dict(labels or {})
        metadata = encode_string(1, name) + encode_string(2, uid) + encode_string(3, namespace)
        linux = encode_string(1, f"{self.cgroup_parent}/pod{uid}")  # LinuxPodSandboxConfig.cgroup_parent
        config = (
            encode_message(1, metadata)
            + encode_string(2, name)  # hostname
            + encode_map(
                6, {**labels, "io.kubernetes.pod.namespace": namespace, "io.kubernetes.pod.name": name}
            )
            + encode_message(8, linux)
        )
        reply = Fields(self.client.call("RunPodSandbox", encode_message(1, config)))
        sandbox_id = reply.string(1)
        pod = LabPod(
            self, sandbox_id, namespace, name, uid, labels, config, self.client.sandbox_detail(sandbox_id)
        )
        self.pods.append(pod)
        assert pod.detail.netns_path, f"sandbox {sandbox_id} has no network namespace: {pod.detail}"
        assert pod.inode
        return pod

    def run_container(self, pod: LabPod, name: str, argv: Sequence[str]) -> str:
        """CreateContainer + StartContainer of the lab image in `pod`, running `argv`; its id."""
        container = (
            encode_message(1, encode_string(1, name))  # metadata
            + encode_message(2, encode_string(1, IMAGE))  # image
            + b"".join(encode_string(3, word) for word in argv)  # command
        )
        request = (
            encode_string(1, pod.sandbox_id) + encode_message(2, container) + encode_message(3, pod.config)
        )
        container_id = Fields(self.client.call("CreateContainer", request)).string(1)
        pod.containers[name] = container_id
        self.client.call("StartContainer", encode_string(1, container_id))
        return container_id

    def container_pid(self, container_id: str) -> int:
        """The container's process on the host (ContainerStatus verbose info's `pid`)."""
        reply = Fields(
            self.client.call("ContainerStatus", encode_string(1, container_id) + encode_varint_field(2, 1))
        )
        info = json.loads(reply.string_map(2)["info"])
        return int(info["pid"])

    def remove_container(self, container_id: str) -> None:
        self.client.call("StopContainer", encode_string(1, container_id) + encode_varint_field(2, 1))
        self.client.call("RemoveContainer", encode_string(1, container_id))

    def remove_pod(self, sandbox_id: str) -> None:
        """StopPodSandbox (kills its containers, tears its network down) and RemovePodSandbox."""
        self.client.call("StopPodSandbox", encode_string(1, sandbox_id))
        self.client.call("RemovePodSandbox", encode_string(1, sandbox_id))
        self.pods = [pod for pod in self.pods if pod.sandbox_id != sandbox_id]

    # -- tear-down -----------------------------------------------------------------------------------------
    def close(self) -> None:
        problems: list[str] = []
        if self._process is not None and self._process.poll() is None and os.path.exists(self.socket):
            try:
                for container in self.client.containers():
                    with contextlib.suppress(CriError):
                        self.remove_container(container.id)
                for sandbox in self.client.sandboxes():
                    try:
                        self.remove_pod(sandbox.id)
                    except CriError as error:
                        problems.append(str(error))
            except CriError as error:
                problems.append(str(error))
        if self._client is not None:
            self._client.close()
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._kill_shims()
        self._kill_pod_processes()
        for pod in self.pods:  # still here only when containerd could not stop them
            if pod.detail.netns_path and os.path.exists(pod.detail.netns_path):
                run("umount", pod.detail.netns_path, check=False)
                with contextlib.suppress(OSError):
                    os.unlink(pod.detail.netns_path)
        run("ip", "link", "del", self.bridge, check=False)
        self._remove_cgroups()
        self._unmount_below()
        run("rm", "-rf", "--one-file-system", str(self.directory), check=False)
        if problems:
            raise RuntimeError("the CRI lab could not remove everything: " + "; ".join(problems))

    def _kill_shims(self) -> None:
        """Shims this containerd started (their command line names its socket) and anything they run."""
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"containerd-shim-runc-v2" in argv[0] and self.socket.encode() in argv:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(int(entry), signal.SIGKILL)  # the shim leads its own process group
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(entry), signal.SIGKILL)

    def _pod_cgroups(self) -> list[Path]:
        """Every cgroup directory below the pods' parent, deepest first, in every hierarchy."""
        found: list[Path] = []
        for hierarchy in Path(_CGROUP_ROOT).iterdir():
            top = hierarchy / self.cgroup_parent.lstrip("/")
            if top.is_dir():
                found += [top, *(path for path in top.rglob("*") if path.is_dir())]
        return sorted(found, key=lambda path: -len(path.parts))

    def _kill_pod_processes(self) -> None:
        """Processes left in the pods' cgroups (a container whose shim died): ours, since the parent is."""

        def remaining() -> set[int]:
            pids: set[int] = set()
            for directory in self._pod_cgroups():
                with contextlib.suppress(OSError):
                    pids.update(int(pid) for pid in (directory / "cgroup.procs").read_text().split())
            return pids

        for pid in remaining():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not remaining(), timeout=10, what="the pods' processes to exit")

    def _remove_cgroups(self) -> None:
        """runc removes a container's cgroup but not the parents it created: /netsleuth-cri-<pid>/pod<uid>."""
        for directory in self._pod_cgroups():
            with contextlib.suppress(OSError):
                directory.rmdir()

    def _unmount_below(self) -> None:
        """Mounts a killed containerd left under its root (image snapshots, /dev/shm of sandboxes)."""
        prefix = str(self.directory) + "/"
        mounts = []
        with open("/proc/self/mountinfo", encoding="utf-8") as mountinfo:
            for line in mountinfo:
                point = line.split()[4]
                if point.startswith(prefix):
                    mounts.append(point)
        for point in sorted(mounts, key=len, reverse=True):
            run("umount", "-l", point, check=False)


@contextlib.contextmanager
def runtime_for_tests(image_archive: Path) -> Iterator[CriLab]:
    """A lab whose socket netsleuth run by the tests (CLI, agent) finds through CONTAINER_RUNTIME_ENDPOINT,
    as crictl would, while it runs (tests/privileged/conftest.py's `cri` fixture, one per module)."""
    before = os.environ.get(ENDPOINT_VARIABLE)
    with CriLab.start(image_archive) as lab:
        os.environ[ENDPOINT_VARIABLE] = lab.endpoint
        try:
            yield lab
        finally:
            if before is None:
                os.environ.pop(ENDPOINT_VARIABLE, None)
            else:
                os.environ[ENDPOINT_VARIABLE] = before
