"""The Kubernetes manifests (packaging/kubernetes/): every kustomization rendered with `kubectl kustomize`,
every rendered object validated against the Kubernetes API's schemas offline (kubernetes-validate, strict: an
unknown field is an error), and what docs/kubernetes.md promises about them checked on the rendered objects:
no privileged container, the agent's exact capabilities, probes on the agent's real endpoints, limits, no
RBAC, the NATS configuration accepted by nats-server, and configurations netsleuth's own parsers accept.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from netsleuth.agent.config import parse_config
from netsleuth.controller.config import load_controller_config
from netsleuth.fleet.protocol import generate_private_key, private_key_to_text, public_key_to_text

REPO = Path(__file__).resolve().parents[2]
KUBERNETES = REPO / "packaging" / "kubernetes"
KUSTOMIZATIONS = sorted(
    str(path.parent.relative_to(KUBERNETES)) for path in KUBERNETES.rglob("kustomization.yaml")
)
# The oldest and the newest API the validator carries: the manifests use nothing newer than the first.
KUBERNETES_VERSIONS = ("1.25.0", kubernetes_validate.latest_version())
AGENT_CAPABILITIES = ["BPF", "PERFMON", "NET_ADMIN", "SYSLOG", "SYS_PTRACE", "DAC_READ_SEARCH"]
Object = dict[str, Any]


def render(kustomization: str) -> list[Object]:
    kubectl = os.environ.get("KUBECTL", "kubectl")
    result = subprocess.run(
        [kubectl, "kustomize", str(KUBERNETES / kustomization)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return [document for document in yaml.safe_load_all(result.stdout) if document]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Object]]:
    return {kustomization: render(kustomization) for kustomization in KUSTOMIZATIONS}


def find(objects: list[Object], kind: str, name: str) -> Object:
    (found,) = [obj for obj in objects if obj["kind"] == kind and obj["metadata"]["name"] == name]
    return found


def pod_specs(objects: list[Object]) -> list[tuple[str, Object]]:
    return [
        (obj["metadata"]["name"], obj["spec"]["template"]["spec"])
        for obj in objects
        if obj["kind"] in ("DaemonSet", "Deployment", "StatefulSet")
    ]


def containers(spec: Object) -> list[Object]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def test_every_kustomization_is_there() -> None:
    assert KUSTOMIZATIONS == ["base", "overlays/fleet", "overlays/fleet-sys-admin"]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_rendered_object_is_valid(
    rendered: dict[str, list[Object]], kustomization: str, version: str
) -> None:
    for obj in rendered[kustomization]:
        kubernetes_validate.validate(obj, version, strict=True)


def test_the_validator_refuses_a_wrong_field(rendered: dict[str, list[Object]]) -> None:
    daemonset = find(rendered["base"], "DaemonSet", "netsleuth-agent")
    broken = yaml.safe_load(yaml.safe_dump(daemonset))
    broken["spec"]["template"]["spec"]["hostPid"] = True  # the field is hostPID
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[0], strict=True)


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_no_container_is_privileged_and_all_are_bounded(
    rendered: dict[str, list[Object]], kustomization: str
) -> None:
    for name, spec in pod_specs(rendered[kustomization]):
        assert spec["automountServiceAccountToken"] is False, name
        for container in containers(spec):
            where = f"{name}/{container['name']}"
            context = container["securityContext"]
            assert not context.get("privileged", False), where
            assert context["allowPrivilegeEscalation"] is False, where
            assert context["readOnlyRootFilesystem"] is True, where
            assert context["capabilities"]["drop"] == ["ALL"], where
            assert set(container["resources"]["limits"]) == {"cpu", "memory"}, where
            assert set(container["resources"]["requests"]) == {"cpu", "memory"}, where
            # Fully named (registry/name:tag): a bare name would be pulled from wherever the node defaults to.
            assert "/" in container["image"] and ":" in container["image"], where


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_no_rbac_and_no_service_account_token(rendered: dict[str, list[Object]], kustomization: str) -> None:
    kinds = {obj["kind"] for obj in rendered[kustomization]}
    assert not kinds & {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}
    for account in (obj for obj in rendered[kustomization] if obj["kind"] == "ServiceAccount"):
        assert account["automountServiceAccountToken"] is False


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_the_agent_daemonset(rendered: dict[str, list[Object]], kustomization: str) -> None:
    objects = rendered[kustomization]
    spec = find(objects, "DaemonSet", "netsleuth-agent")["spec"]["template"]["spec"]
    assert spec["hostPID"] is True and spec["hostNetwork"] is True
    (agent,) = [container for container in spec["containers"] if container["name"] == "agent"]
    added = agent["securityContext"]["capabilities"]["add"]
    if kustomization.endswith("sys-admin"):
        assert added == [*AGENT_CAPABILITIES, "SYS_ADMIN"]
        assert agent["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    else:
        assert added == AGENT_CAPABILITIES
    mounts = {mount["mountPath"]: mount for mount in agent["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in spec["volumes"]}
    socket = mounts["/run/containerd/containerd.sock"]
    assert socket["readOnly"] is True and volumes[socket["name"]]["hostPath"]["type"] == "Socket"
    for path in ("/sys/kernel/btf", "/sys/kernel/tracing", "/run/netns"):
        assert mounts[path]["readOnly"] is True
        assert volumes[mounts[path]["name"]]["hostPath"]["path"] == path
    # The probes ask the agent's own endpoints on the port its configuration listens on.
    config_path = agent["args"][agent["args"].index("--config") + 1]
    config_map = find(objects, "ConfigMap", "netsleuth-agent")["data"]["agent.toml"]
    port = int(tomllib.loads(config_map)["agent"]["listen"].rsplit(":", 1)[1])
    ports = {entry["name"]: entry["containerPort"] for entry in agent["ports"]}
    assert agent["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert agent["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert ports["metrics"] == port
    assert config_path.endswith("agent.toml")


def test_the_base_agent_configuration_parses(rendered: dict[str, list[Object]]) -> None:
    objects = rendered["base"]
    config = parse_config(tomllib.loads(find(objects, "ConfigMap", "netsleuth-agent")["data"]["agent.toml"]))
    assert config.fleet is None and config.socket is None and config.listen.port == 9478


def _run_node_config(script: str, tmp_path: Path, node: str) -> Path:
    """The fleet's init container script, run here with its three folders moved under tmp_path."""
    for folder in ("config", "credentials", "run/netsleuth"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
    for folder in ("/config", "/credentials", "/run/netsleuth"):
        script = script.replace(folder + "/", f"{tmp_path}{folder}/")
    subprocess.run(["sh", "-ec", script], env={"NODE_NAME": node, "PATH": "/usr/bin:/bin"}, check=True)
    return tmp_path / "run/netsleuth"


def test_the_fleet_agent_configuration_parses_for_a_node(
    rendered: dict[str, list[Object]], tmp_path: Path
) -> None:
    objects = rendered["overlays/fleet"]
    spec = find(objects, "DaemonSet", "netsleuth-agent")["spec"]["template"]["spec"]
    (init,) = spec["initContainers"]
    template = find(objects, "ConfigMap", "netsleuth-agent")["data"]["agent.toml"]
    key = generate_private_key()
    (tmp_path / "config").mkdir()
    (tmp_path / "config/agent.toml").write_text(
        template.replace("ed25519:CHANGE-ME", public_key_to_text(key.public_key()))
    )
    (tmp_path / "credentials").mkdir()
    (tmp_path / "credentials/node-a-example-com.password").write_text("a-password-for-node-a\n")
    run = _run_node_config(init["command"][-1], tmp_path, "node-a.example.com")
    assert (run / "fleet.password").stat().st_mode & 0o777 == 0o600
    text = (run / "agent.toml").read_text().replace("/run/netsleuth/", f"{run}/")
    config = parse_config(tomllib.loads(text))
    assert config.fleet is not None and config.fleet.host_id == "node-a-example-com"
    assert (
        config.fleet.user == "agent-node-a-example-com" and config.fleet.password() == "a-password-for-node-a"
    )


def test_the_controller_configuration_parses(rendered: dict[str, list[Object]], tmp_path: Path) -> None:
    objects = rendered["overlays/fleet"]
    deployment = find(objects, "Deployment", "netsleuth-controller")["spec"]["template"]["spec"]
    (controller,) = deployment["containers"]
    assert controller["readinessProbe"]["httpGet"]["path"] == "/api/v1/auth"
    secret_files = set(find(objects, "Secret", "netsleuth-controller")["stringData"])
    text = find(objects, "ConfigMap", "netsleuth-controller")["data"]["controller.toml"]
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "controller.key").write_text(private_key_to_text(generate_private_key()) + "\n")
    (secrets / "nats.password").write_text("a-password-for-the-controller\n")
    for path in secrets.iterdir():
        path.chmod(0o440)
    assert {path.name for path in secrets.iterdir()} == secret_files
    config_file = tmp_path / "controller.toml"
    config_file.write_text(text.replace("/etc/netsleuth/secrets/", f"{secrets}/"))
    config = load_controller_config(config_file)
    assert config.http.port == int(controller["ports"][0]["containerPort"]) == 8477


def test_nats_is_three_servers_routed_to_each_other(rendered: dict[str, list[Object]]) -> None:
    objects = rendered["overlays/fleet"]
    statefulset = find(objects, "StatefulSet", "netsleuth-nats")
    assert statefulset["spec"]["replicas"] == 3
    headless = find(objects, "Service", statefulset["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    config = find(objects, "Secret", "netsleuth-nats")["stringData"]["nats.conf"]
    routes = [line for line in config.splitlines() if "nats-route://route:" in line]
    expected = [f"netsleuth-nats-{index}.{headless['metadata']['name']}:6222" for index in range(3)]
    assert [route.split("@")[1].rstrip('",') for route in routes] == expected


def test_the_nats_secret_is_generated_from_the_fleet_permissions() -> None:
    # By path: the folder is not a package, and `packaging` is also PyPI's.
    spec = importlib.util.spec_from_file_location("nats_secret", KUBERNETES / "nats_secret.py")
    assert spec is not None and spec.loader is not None
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    assert generator.SECRET.read_text() == generator.secret_yaml(["node-a"]), (
        "the NATS permissions changed: run `.venv/bin/python packaging/kubernetes/nats_secret.py` and commit"
    )


def test_nats_server_accepts_the_configuration(rendered: dict[str, list[Object]], tmp_path: Path) -> None:
    server = shutil.which("nats-server")
    assert server is not None, "nats-server is missing: make deps"
    config = tmp_path / "nats.conf"
    config.write_text(find(rendered["overlays/fleet"], "Secret", "netsleuth-nats")["stringData"]["nats.conf"])
    result = subprocess.run(
        [server, "-c", str(config), "-t"],
        capture_output=True,
        text=True,
        env={"POD_NAME": "netsleuth-nats-0"},
    )
    assert result.returncode == 0 and "is valid" in result.stderr + result.stdout, result.stderr
