"""Kubernetes manifests for a Pathways cluster: ``pathways k8s render``.

One coordinator (a StatefulSet of one pod, so it has a stable DNS name through a headless
Service) and N hosts (an Indexed Job: pod i is host i, in island ``i // hosts_per_island``).
Every pod reads the cluster's CURVE key pair from a Secret mounted at ``/keys``
(``$PLAQUE_KEYS``) and announces its pod IP (``$PLAQUE_ADVERTISE``), since it listens on
wildcard addresses; the coordinator's client port is fixed, its other ports are found through
it. A ConfigMap publishes the address clients give to ``pw.connect`` (from inside the cluster,
or through ``kubectl port-forward``).

The keys: ``pathways keys DIR`` then ``kubectl create secret generic NAME-keys
--from-file=DIR``, or ``--embed-keys DIR`` to put them into the rendered Secret. The output is
YAML (JSON-compatible scalars), one document per object.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from pathlib import Path

from plaque import security

from .cluster import hosts_per_island

KEYS_MOUNT = "/keys"
_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]*")  # a mapping key YAML reads as this string


@dataclass(frozen=True)
class Spec:
    """What to render: ``hosts`` host pods in ``islands`` equal islands."""

    hosts: int
    islands: int = 1
    devices_per_host: int = 4
    image: str = "pathways-open:latest"
    namespace: str = "default"
    name: str = "pathways"
    port: int = 5555
    hbm_gib: float = 16.0

    def __post_init__(self):
        hosts_per_island(self.hosts, self.islands)
        if self.devices_per_host < 1:
            raise ValueError(f"devices per host must be positive, got {self.devices_per_host}")
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in 1-65535, got {self.port}")

    @property
    def coordinator_host(self) -> str:
        return f"{self.name}-coordinator-0.{self.name}.{self.namespace}.svc.cluster.local"

    @property
    def address(self) -> str:
        return f"tcp://{self.coordinator_host}:{self.port}"


def render(spec: Spec, embed_keys: str | None = None) -> list[dict]:
    """The cluster's Kubernetes objects; with ``embed_keys`` (a key directory) its Secret too."""
    labels = {"app.kubernetes.io/name": "pathways", "app.kubernetes.io/instance": spec.name}
    docs = []
    if embed_keys is not None:
        docs.append(_secret(spec, labels, embed_keys))
    coordinator = {**labels, "app.kubernetes.io/component": "coordinator"}
    docs += [
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": _meta(spec, f"{spec.name}-address", labels),
         "data": {"address": spec.address}},
        {"apiVersion": "v1", "kind": "Service",
         "metadata": _meta(spec, spec.name, labels),
         "spec": {"clusterIP": "None", "selector": coordinator,
                  "ports": [{"name": "clients", "port": spec.port, "targetPort": spec.port}]}},
        {"apiVersion": "apps/v1", "kind": "StatefulSet",
         "metadata": _meta(spec, f"{spec.name}-coordinator", coordinator),
         "spec": {"serviceName": spec.name, "replicas": 1,
                  "selector": {"matchLabels": coordinator},
                  "template": {"metadata": {"labels": coordinator},
                               "spec": _pod(spec, "coordinator", [
                                   "pathways", "coordinator", "--bind", "tcp://0.0.0.0",
                                   "--port", str(spec.port)], ports=[spec.port])}}},
        _hosts(spec, labels),
    ]
    return docs


def _hosts(spec: Spec, labels: dict) -> dict:
    per_island = hosts_per_island(spec.hosts, spec.islands)
    command = ["sh", "-c",
               "exec pathways host --coordinator \"$COORDINATOR\" --bind tcp://0.0.0.0"
               f" --island $((JOB_COMPLETION_INDEX / {per_island}))"
               f" --devices {spec.devices_per_host} --hbm-gib {spec.hbm_gib:g}"]
    hosts = {**labels, "app.kubernetes.io/component": "host"}
    pod = _pod(spec, "host", command, extra_env=[{"name": "COORDINATOR",
                                                  "value": spec.address}])
    pod["restartPolicy"] = "OnFailure"
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": _meta(spec, f"{spec.name}-hosts", hosts),
            "spec": {"completionMode": "Indexed", "completions": spec.hosts,
                     "parallelism": spec.hosts, "backoffLimit": 3 * spec.hosts,
                     "template": {"metadata": {"labels": hosts}, "spec": pod}}}


def _pod(spec: Spec, role: str, command: list, ports=(), extra_env=()) -> dict:
    container = {
        "name": role, "image": spec.image, "command": command,
        "env": [{"name": security.ENV, "value": KEYS_MOUNT},
                {"name": "PLAQUE_ADVERTISE",
                 "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                *extra_env],
        "volumeMounts": [{"name": "keys", "mountPath": KEYS_MOUNT, "readOnly": True}],
    }
    if ports:
        container["ports"] = [{"containerPort": p, "name": "clients"} for p in ports]
    return {"containers": [container],
            "volumes": [{"name": "keys", "secret": {"secretName": f"{spec.name}-keys",
                                                    "defaultMode": 0o400}}]}


def _secret(spec: Spec, labels: dict, directory: str) -> dict:
    security.check(directory)
    files = {f"{security.NAME}.key", f"{security.NAME}.key_secret"}
    data = {f: base64.b64encode((Path(directory) / f).read_bytes()).decode() for f in
            sorted(files)}
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": _meta(spec, f"{spec.name}-keys", labels), "data": data}


def _meta(spec: Spec, name: str, labels: dict) -> dict:
    return {"name": name, "namespace": spec.namespace, "labels": dict(labels)}


def to_yaml(docs: list[dict]) -> str:
    """YAML documents; scalars are written as JSON (a subset of YAML), so no YAML library is
    needed to write them and any reads them back."""
    return "".join("---\n" + _yaml(doc, 0) for doc in docs)


def _yaml(value, indent: int) -> str:
    pad = " " * indent
    if isinstance(value, dict):
        if not value:
            return pad + "{}\n"
        out = []
        for k, v in value.items():
            if isinstance(v, (dict, list)) and v:
                out.append(f"{pad}{_key(k)}:\n{_yaml(v, indent + 2)}")
            else:
                out.append(f"{pad}{_key(k)}: {_scalar(v)}\n")
        return "".join(out)
    if isinstance(value, list):
        out = []
        for v in value:
            if isinstance(v, (dict, list)) and v:
                body = _yaml(v, indent + 2)
                out.append(f"{pad}- {body[indent + 2:]}")
            else:
                out.append(f"{pad}- {_scalar(v)}\n")
        return "".join(out)
    return pad + _scalar(value) + "\n"


def _key(key: str) -> str:
    return key if _PLAIN.fullmatch(key) else json.dumps(key)


def _scalar(value) -> str:
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return json.dumps(value)
