"""deploy/: the Kubernetes manifests validate against the Kubernetes schemas (kubernetes-validate ships them,
no network), the compose file has the services and mounts it promises, and every `sluice` command line in the
Dockerfile, the compose file and the manifests parses with the real CLI parser, so a renamed flag breaks
this test instead of a deployment."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from runtime.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUBERNETES_VERSION = "1.30"
MANIFESTS = sorted((DEPLOY / "kubernetes").glob("*.yaml"))


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def parses(argv: list[str]) -> Any:
    """The namespace the real parser makes of a `sluice` command line; a bad flag fails the test here."""
    try:
        return build_parser().parse_args(argv)
    except SystemExit as exc:
        raise AssertionError(f"sluice {' '.join(argv)}: does not parse (see the error above)") from exc


def test_there_are_manifests() -> None:
    assert [p.name for p in MANIFESTS] == ["minio.yaml", "namespace.yaml", "sluice.yaml"]


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_manifest_validates_against_the_kubernetes_schema(path: Path) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for doc in documents(path):
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"{path.name}: {doc['kind']} {doc['metadata']['name']}: {exc}") from None


def test_the_validator_refuses_a_broken_manifest() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    doc = next(d for d in documents(DEPLOY / "kubernetes" / "sluice.yaml") if d["kind"] == "StatefulSet")
    doc["spec"]["replicas"] = "three"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    doc["spec"]["replicas"] = 3
    doc["spec"]["template"]["spec"]["containers"][0]["argz"] = []
    with pytest.raises(kubernetes_validate.ValidationError):  # strict: an unknown field is an error
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def expand(args: list[str], env: dict[str, str]) -> list[str]:
    """Kubernetes' $(VAR) expansion in container args."""
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in args]


HTTP_PORT = 8081  # the REST API and web UI, the same in the Dockerfile, compose and Kubernetes


def kubernetes_env(docs: list[dict[str, Any]], pod: str) -> dict[str, str]:
    configmap = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "sluice-s3")
    return {**configmap["data"], "POD_IP": "10.1.2.3", "POD_NAME": pod}


def kubernetes_docs() -> list[dict[str, Any]]:
    return [d for p in MANIFESTS for d in documents(p)]


def sluice_workload(docs: list[dict[str, Any]], name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The StatefulSet `name` and its container."""
    workload = next(d for d in docs if d["metadata"]["name"] == name and d["kind"] == "StatefulSet")
    return workload, workload["spec"]["template"]["spec"]["containers"][0]


def test_the_kubernetes_sluice_commands_parse_and_agree_with_their_ports() -> None:
    docs = kubernetes_docs()
    workloads = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")
                 and d["metadata"]["name"].startswith("sluice-")]
    assert sorted(d["metadata"]["name"] for d in workloads) == ["sluice-coordinator", "sluice-worker"]
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    for workload in workloads:
        container = workload["spec"]["template"]["spec"]["containers"][0]
        args = parses(expand(container["args"], kubernetes_env(docs, f"{workload['metadata']['name']}-0")))
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert args.host == "0.0.0.0" and args.advertise, args
        expected = ({"rpc": args.port, "http": args.http_port, "metrics": args.metrics_port}
                    if args.command == "coordinator" else {"data": args.data_port, "metrics": args.metrics_port})
        assert ports == expected
        assert args.token_file.startswith(next(m["mountPath"] for m in container["volumeMounts"]
                                               if m["name"] == "token"))
        service = services[workload["metadata"]["name"]]
        assert workload["spec"]["serviceName"] == service["metadata"]["name"]
        assert service["spec"]["clusterIP"] == "None"  # headless: it names each pod
        assert service["spec"]["selector"] == workload["spec"]["selector"]["matchLabels"]
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= set(ports)
        if args.command == "coordinator":
            assert args.checkpoint_dir.startswith("s3://"), "checkpoints in the object store"
            assert all(r.startswith("s3://") for r in args.savepoint_root)
            meta = workload["metadata"]
            assert args.advertise == f"{meta['name']}-0.{meta['name']}.{meta['namespace']}.svc.cluster.local"
        else:
            coordinators, _ = sluice_workload(docs, "sluice-coordinator")
            meta = coordinators["metadata"]
            assert list(args.coordinator) == [
                (f"{meta['name']}-{i}.{meta['name']}.{meta['namespace']}.svc.cluster.local", 6123)
                for i in range(coordinators["spec"]["replicas"])], "every coordinator, so a worker finds the leader"


def test_the_kubernetes_coordinator_has_a_standby_and_keeps_its_state_on_a_shared_persistent_volume() -> None:
    docs = kubernetes_docs()
    coordinators, container = sluice_workload(docs, "sluice-coordinator")
    args = parses(expand(container["args"], kubernetes_env(docs, "sluice-coordinator-1")))
    assert coordinators["spec"]["replicas"] >= 2 and args.standby, "a leader and a standby that takes over"
    state = next(m for m in container["volumeMounts"] if m["mountPath"] == args.state_dir)
    volume = next(v for v in coordinators["spec"]["template"]["spec"]["volumes"] if v["name"] == state["name"])
    assert "emptyDir" not in volume, "an emptyDir state dir forgets the running jobs when the pod moves"
    claim = next(d for d in docs if d["kind"] == "PersistentVolumeClaim"
                 and d["metadata"]["name"] == volume["persistentVolumeClaim"]["claimName"])
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"], "both coordinators mount the one lease directory"
    # the standby is not ready, yet workers must resolve it; clients reach the ready one, the leader
    headless = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "sluice-coordinator")
    assert headless["spec"]["publishNotReadyAddresses"] is True
    leader = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "sluice-coordinator-leader")
    assert leader["spec"]["selector"] == coordinators["spec"]["selector"]["matchLabels"]
    assert {p["name"]: p["port"] for p in leader["spec"]["ports"]} == {"rpc": args.port, "http": HTTP_PORT}
    probe = " ".join(container["readinessProbe"]["exec"]["command"])
    assert f"127.0.0.1:{args.metrics_port}/metrics" in probe and "sluice_coordinator_is_leader 1" in probe


@pytest.mark.parametrize("leading", [True, False])
def test_the_kubernetes_leader_probe_matches_the_leader_and_not_the_standby(leading: bool) -> None:
    """The probe's pattern against the metrics text the coordinator serves (a rename would leave no pod ready)."""
    from prometheus_client import CollectorRegistry, generate_latest

    from coordinator.metrics import LeadershipCollector, LeadershipStatistics

    registry = CollectorRegistry()
    registry.register(LeadershipCollector(lambda: LeadershipStatistics(leading, 3 if leading else 0, 0, 0, 0)))
    text = generate_latest(registry).decode()
    _, container = sluice_workload(kubernetes_docs(), "sluice-coordinator")
    probe = " ".join(container["readinessProbe"]["exec"]["command"])
    pattern = re.search(r'r"(\^[^"]+)"', probe)
    assert pattern is not None, probe
    assert bool(re.search(pattern.group(1), text, re.M)) is leading, text


def test_the_namespace_comes_first_and_every_object_is_in_it() -> None:
    (namespace,) = documents(DEPLOY / "kubernetes" / "namespace.yaml")
    assert namespace["kind"] == "Namespace"
    for path in MANIFESTS:
        for doc in documents(path):
            if doc["kind"] != "Namespace":
                assert doc["metadata"]["namespace"] == namespace["metadata"]["name"], (path.name, doc["kind"])
            else:
                assert path.name == "namespace.yaml", f"{path.name} creates the namespace too"


def kubectl_steps(text: str) -> list[str]:
    return [line.strip(" #") for line in text.splitlines() if "kubectl " in line]


@pytest.mark.parametrize("where", ["sluice.yaml", "README.md"])
def test_the_kubernetes_steps_create_the_namespace_then_the_token_then_sluice(where: str) -> None:
    text = (ROOT / "README.md" if where == "README.md" else DEPLOY / "kubernetes" / where).read_text()
    steps = kubectl_steps(text)

    def first(needle: str) -> int:
        found = [i for i, step in enumerate(steps) if needle in step]
        assert found, f"{where}: no kubectl step with {needle!r} in {steps}"
        return found[0]

    order = [first("apply -f deploy/kubernetes/namespace.yaml"), first("create secret generic sluice-token"),
             first("apply -f deploy/kubernetes/sluice.yaml"), first("sluice submit")]
    assert order == sorted(order), f"{where}: the steps are out of order: {steps}"
    token = next(s for s in steps if "create secret generic sluice-token" in s)
    _, container = sluice_workload(kubernetes_docs(), "sluice-coordinator")
    mount = next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == "token")
    assert "--from-literal=token=" in token and f"--token-file {mount}/token" in text


COMPOSE = DEPLOY / "compose.yaml"


def compose() -> dict[str, Any]:
    return dict(yaml.safe_load(COMPOSE.read_text()))


def test_the_compose_file_has_a_coordinator_workers_an_object_store_prometheus_and_grafana() -> None:
    services = compose()["services"]
    assert {"coordinator", "worker", "minio", "prometheus", "grafana"} <= set(services)
    assert services["worker"]["deploy"]["replicas"] >= 2
    for name in ("coordinator", "worker"):
        build = services[name]["build"]
        assert (COMPOSE.parent / build["context"] / build["dockerfile"]).resolve() == DEPLOY / "Dockerfile"
        assert services[name]["secrets"] == ["sluice_token"]
        assert services[name]["environment"]["AWS_ENDPOINT_URL"] == "http://minio:9000"
    mounts = {m.split(":")[1]: m.split(":")[0] for m in services["grafana"]["volumes"]}
    assert mounts["/etc/grafana/provisioning"] == "./grafana/provisioning"  # restui's deploy/grafana/
    assert mounts["/var/lib/grafana/dashboards"] == "./grafana"
    prometheus = services["prometheus"]["volumes"][0].split(":")
    assert (COMPOSE.parent / prometheus[0]).is_file() and prometheus[1] == "/etc/prometheus/prometheus.yml"


def test_the_compose_sluice_commands_parse_and_prometheus_scrapes_their_metrics_ports() -> None:
    services = compose()["services"]
    coordinator, worker = parses(services["coordinator"]["command"]), parses(services["worker"]["command"])
    assert coordinator.host == worker.host == "0.0.0.0"
    assert worker.coordinator == ((coordinator.advertise, coordinator.port),) == (("coordinator", 6123),)
    assert coordinator.http_port == HTTP_PORT and f"{HTTP_PORT}:{HTTP_PORT}" in services["coordinator"]["ports"]
    assert coordinator.checkpoint_dir == "s3://sluice/checkpoints"
    bucket = coordinator.checkpoint_dir.split("/")[2]
    assert f"store/{bucket}" in services["create-bucket"]["command"][0]
    scrape = yaml.safe_load((DEPLOY / "prometheus-compose.yml").read_text())["scrape_configs"]
    jobs = {j["job_name"]: j for j in scrape}
    assert jobs["sluice-coordinator"]["static_configs"][0]["targets"] == [f"coordinator:{coordinator.metrics_port}"]
    assert jobs["sluice-workers"]["dns_sd_configs"][0] == {"names": ["worker"], "type": "A",
                                                           "port": worker.metrics_port}


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def test_the_dockerfile_command_parses_and_what_it_copies_exists() -> None:
    instructions = dockerfile_instructions()
    entrypoint = json.loads(next(v for k, v in instructions if k == "ENTRYPOINT"))
    cmd = json.loads(next(v for k, v in instructions if k == "CMD"))
    assert entrypoint == ["sluice"]
    args = parses(cmd)
    assert args.command == "coordinator" and args.host == "0.0.0.0"
    exposed = {int(p) for k, v in instructions if k == "EXPOSE" for p in v.split()}
    assert {args.port, args.metrics_port, args.http_port} <= exposed and args.http_port == HTTP_PORT
    for k, v in instructions:
        if k == "COPY":
            for source in shlex.split(v)[:-1]:
                assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
    extras = re.search(r"pip install '\.\[([\w,]+)\]'", " ".join(v for k, v in instructions if k == "RUN"))
    assert extras is not None
    assert {"s3", "rocksdb", "remote", "parquet"} <= set(extras.group(1).split(",")), "what a cluster uses"
    pyproject = (ROOT / "pyproject.toml").read_text()
    for extra in extras.group(1).split(","):
        assert re.search(rf"^{extra} = \[", pyproject, re.M), f"extra {extra} is not in pyproject.toml"
