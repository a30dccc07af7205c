"""``pathways k8s render``: the manifests parse as YAML and are valid Kubernetes objects
(``kubernetes-validate``'s bundled schemas, strict: unknown fields refused), for several cluster
shapes, with and without embedded keys; the hosts' islands and the published address agree;
bad shapes are refused; the command writes what the function renders."""

from __future__ import annotations

import base64
import subprocess
import sys

import kubernetes_validate as kv
import pytest
import yaml
from conftest import ROOT

from pathways.k8s import Spec, render, to_yaml
from plaque import security

VERSION = kv.latest_version()


def objects(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


@pytest.mark.parametrize("hosts, islands, devices", [(1, 1, 4), (2, 1, 8), (6, 3, 2)])
def test_rendered_manifests_are_valid_kubernetes(hosts, islands, devices, tmp_path):
    security.generate(tmp_path)
    spec = Spec(hosts, islands, devices, namespace="ml", name="pw")
    docs = objects(to_yaml(render(spec, embed_keys=str(tmp_path))))
    assert docs == render(spec, embed_keys=str(tmp_path))  # the YAML reads back exactly
    for doc in docs:
        kv.validate(doc, VERSION, strict=True)
    kinds = {d["kind"]: d for d in docs}
    assert set(kinds) == {"Secret", "ConfigMap", "Service", "StatefulSet", "Job"}
    job = kinds["Job"]["spec"]
    assert job["completions"] == job["parallelism"] == hosts
    assert f"/ {hosts // islands})) --devices {devices}" in \
        job["template"]["spec"]["containers"][0]["command"][2]
    assert kinds["ConfigMap"]["data"]["address"] == \
        f"tcp://pw-coordinator-0.pw.ml.svc.cluster.local:{spec.port}"
    secret = kinds["Secret"]["data"]
    assert base64.b64decode(secret["cluster.key_secret"]) == \
        (tmp_path / "cluster.key_secret").read_bytes()


def test_an_invalid_object_would_be_caught():
    job = render(Spec(2))[-1]
    job["spec"]["completions"] = "two"
    with pytest.raises(kv.ValidationError):
        kv.validate(job, VERSION, strict=True)


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="equal islands"):
        Spec(3, islands=2)
    with pytest.raises(ValueError, match="port"):
        Spec(2, port=70000)
    out = subprocess.run([sys.executable, "-m", "pathways", "k8s", "render", "--hosts", "3",
                          "--islands", "2"], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "equal islands" in out.stderr and "Traceback" not in out.stderr


def test_the_command_writes_the_rendered_manifests(tmp_path):
    path = tmp_path / "pathways.yaml"
    out = subprocess.run([sys.executable, "-m", "pathways", "k8s", "render", "--hosts", "2",
                          "-o", str(path)], capture_output=True, text=True, timeout=60,
                         check=True)
    assert objects(path.read_text()) == render(Spec(2))
    assert "kubectl create secret generic pathways-keys" in out.stderr


def test_the_committed_example_is_what_render_writes_today():

    example = ROOT / "deploy" / "kubernetes" / "pathways.yaml"
    assert objects(example.read_text()) == render(Spec(2)), (
        "deploy/kubernetes/pathways.yaml is stale: pathways k8s render --hosts 2 -o it")


def test_the_image_installs_what_hosts_run():
    # a rendered cluster's hosts failed every JAX body and checkpoint: the image had neither
    import re
    import tomllib

    dockerfile = (ROOT / "deploy" / "kubernetes" / "Dockerfile").read_text()
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    installed = re.search(r'pip install [^\n]*"\.\[([a-z,]+)\]"', dockerfile)
    assert installed, dockerfile
    wanted = set(installed.group(1).split(","))
    assert {"jax", "zarr"} <= wanted <= set(extras)

