"""The kind provider's check before it creates a cluster (unit tier: fake `docker` and `kind`
commands, no engine): a machine whose engine has kind's node image, or can pull it, goes on; one that
has neither skips the smoke tier with the reason, or fails it when QUEUEWORKER_REQUIRE_CLUSTER=1."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from tests.cluster.fixtures import REQUIRE_ENV, unavailable

from .harness import KIND_NODE_IMAGE_ENV, KindCluster, SmokeUnavailable, kind_node_image, require_node_image

NODE_IMAGE = "kindest/node:v1.35.0@sha256:" + "ab" * 32
PULL_ERROR = ("Error response from daemon: Get https://registry-1.docker.io/v2/: "
              "dial tcp: lookup registry-1.docker.io: no such host")


def fake_command(directory: Path, name: str, script: str) -> Path:
    """An executable `name` that appends its arguments to `name.calls`, then runs `script` (sh)."""
    path = directory / name
    path.write_text(f'#!/bin/sh\necho "$*" >> "{directory / name}.calls"\n{script}\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def calls(command: Path) -> list[str]:
    log = command.with_name(f"{command.name}.calls")
    return log.read_text().splitlines() if log.exists() else []


def fake_docker(tmp_path: Path, inspect_rc: int, pull_rc: int) -> Path:
    return fake_command(tmp_path, "docker", f'''case "$1" in
  image) exit {inspect_rc} ;;
  pull) [ {pull_rc} = 0 ] || echo "{PULL_ERROR}" >&2; exit {pull_rc} ;;
esac
exit 99''')


def test_an_image_present_locally_is_not_pulled(tmp_path: Path) -> None:
    docker = fake_docker(tmp_path, inspect_rc=0, pull_rc=1)
    require_node_image(str(docker), NODE_IMAGE)
    assert calls(docker) == [f"image inspect {NODE_IMAGE}"]


def test_an_absent_image_that_can_be_pulled_is_pulled(tmp_path: Path) -> None:
    docker = fake_docker(tmp_path, inspect_rc=1, pull_rc=0)
    require_node_image(str(docker), NODE_IMAGE)
    assert calls(docker) == [f"image inspect {NODE_IMAGE}", f"pull {NODE_IMAGE}"]


def test_an_image_neither_present_nor_pullable_makes_the_provider_unavailable(tmp_path: Path) -> None:
    docker = fake_docker(tmp_path, inspect_rc=1, pull_rc=1)
    with pytest.raises(SmokeUnavailable) as raised:
        require_node_image(str(docker), NODE_IMAGE)
    assert NODE_IMAGE in str(raised.value)
    assert "no such host" in str(raised.value)


def test_the_default_node_image_is_read_from_the_kind_binary(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(KIND_NODE_IMAGE_ENV, raising=False)
    kind = tmp_path / "kind"
    kind.write_bytes(b"\x00\x7fELF...kindest/node:latest" + NODE_IMAGE.encode() + b"sigs.k8s.io/kind\x00")
    assert kind_node_image(kind) == NODE_IMAGE
    monkeypatch.setenv(KIND_NODE_IMAGE_ENV, "kindest/node:v1.34.0")
    assert kind_node_image(kind) == "kindest/node:v1.34.0"
    monkeypatch.delenv(KIND_NODE_IMAGE_ENV)
    kind.write_bytes(b"no image in here")
    with pytest.raises(SmokeUnavailable, match=KIND_NODE_IMAGE_ENV):
        kind_node_image(kind)


@pytest.mark.parametrize("pullable", [True, False])
def test_kind_creates_a_cluster_only_when_its_node_image_can_be_had(tmp_path: Path, monkeypatch,
                                                                    pullable: bool) -> None:
    monkeypatch.setenv(KIND_NODE_IMAGE_ENV, NODE_IMAGE)
    docker = fake_docker(tmp_path, inspect_rc=1, pull_rc=0 if pullable else 1)
    kind = fake_command(tmp_path, "kind", "exit 0")
    cluster = KindCluster(tmp_path / "helm", tmp_path / "kubeconfig", kind=kind, docker=str(docker), name="qw-test")
    if pullable:
        cluster.create()
        assert f"create cluster --name qw-test --image {NODE_IMAGE} --kubeconfig {tmp_path / 'kubeconfig'} " \
               "--wait 180s" in calls(kind)
    else:
        with pytest.raises(SmokeUnavailable):
            cluster.create()
        assert not any(call.startswith("create") for call in calls(kind))


@pytest.mark.parametrize("required", [{}, {REQUIRE_ENV: "1"}, {"CI": "true"}])
def test_an_unavailable_provider_skips_and_fails_when_a_cluster_is_required(monkeypatch, required) -> None:
    for name in (REQUIRE_ENV, "CI"):
        monkeypatch.delenv(name, raising=False)
    for name, value in required.items():
        monkeypatch.setenv(name, value)
    outcome = pytest.fail.Exception if required else pytest.skip.Exception
    with pytest.raises(outcome, match="node image"):
        unavailable("smoke tier unavailable (kind provider): kind's node image ... cannot be pulled")
