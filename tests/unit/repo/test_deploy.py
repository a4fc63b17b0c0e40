"""deploy/ and docker-compose.yml stay true to the code: every file a kustomization names exists, every
REMEDIATION_* variable is a real setting, the shipped config validates, and every command the manifests
run is a command of the `remediation` console script."""

from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

import pytest
import yaml

from remediation.adapters.kube.validator import job_manifest
from remediation.domain.gpu_reset import reset_command
from remediation.settings import ClusterEntry, Settings, load_settings, load_watched
from remediation.validation.port import ValidationCheck
from tests.composefile import MissingVariable, compose

ROOT = Path(__file__).resolve().parents[3]
KUSTOMIZATIONS = sorted((ROOT / "deploy").rglob("kustomization.yaml"))


def _docs(path: Path) -> list[Any]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _env_names(obj: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(obj, dict):
        for key, value in obj.items():
            if isinstance(key, str) and key.startswith("REMEDIATION_"):
                found.add(key)
            if key == "name" and isinstance(value, str) and value.startswith("REMEDIATION_"):
                found.add(value)
            found |= _env_names(value)
    elif isinstance(obj, list):
        for item in obj:
            found |= _env_names(item)
    return found


def _setting_exists(env: str) -> bool:
    if env == "REMEDIATION_CONFIG":
        return True
    parts = env.removeprefix("REMEDIATION_").lower().split("__")
    model: Any = Settings
    if parts[0] == "clusters" and len(parts) > 2:  # REMEDIATION_CLUSTERS__<NAME>__...: a field of an entry
        model, parts = ClusterEntry, parts[2:]
    for part in parts:
        fields = getattr(model, "model_fields", None)
        if fields is None or part not in fields:
            return False
        model = fields[part].annotation
    return True


@pytest.mark.parametrize("path", KUSTOMIZATIONS, ids=[str(p.relative_to(ROOT)) for p in KUSTOMIZATIONS])
def test_kustomization_resources_exist(path: Path) -> None:
    (doc,) = _docs(path)
    for res in doc.get("resources", []):
        assert (path.parent / res).exists(), f"{path}: missing resource {res}"


COMPOSE_TLS = ROOT / "docker-compose.tls.yml"


def manifests() -> list[Path]:
    return sorted(p for p in (ROOT / "deploy").rglob("*.yaml")) + [ROOT / "docker-compose.yml", COMPOSE_TLS]


@pytest.mark.parametrize("path", manifests(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_environment_variable_is_a_setting(path: Path) -> None:
    names = set().union(*(_env_names(d) for d in _docs(path)))
    unknown = sorted(n for n in names if not _setting_exists(n))
    assert not unknown, f"{path}: not settings: {unknown}"


def test_shipped_config_validates(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (cm,) = [d for d in _docs(ROOT / "deploy/base/config.yaml") if d["kind"] == "ConfigMap"]
    cfg = tmp_path / "config.yaml"
    cfg.write_text(cm["data"]["config.yaml"])
    for key in list(os.environ):
        if key.startswith("REMEDIATION_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("REMEDIATION_CONFIG", str(cfg))
    monkeypatch.setenv("REMEDIATION_SLURM__REST_TOKEN", "a-jwt")  # as the worker's Secret gives it
    settings = Settings()  # a token over http:// to slurmrestd.slurm would be refused
    assert settings.dry_run is True and settings.slurm.backend == "rest"


def test_manifests_run_only_real_commands() -> None:
    from typer.main import get_command

    from remediation.cli.main import app

    commands = set(get_command(app).commands)  # type: ignore[attr-defined]
    used: set[str] = set()
    for path in manifests():
        for doc in _docs(path):
            # Kubernetes containers; compose services are resolved through their entrypoints below.
            for node in _walk(doc) if not path.name.startswith("docker-compose") else []:
                args = node.get("args") or node.get("command")
                if (
                    isinstance(args, list)
                    and args
                    and node.get("image") in ("node-remediation", "node-remediation:dev")
                ):
                    used.add(args[0])
            if path.name == "docker-compose.yml":
                for program, argv in _compose_invocations().values():
                    if program == ["remediation"]:
                        used.add(argv[0])
    assert used and used <= commands, sorted(used - commands)


def _walk(obj: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if isinstance(obj, dict):
        out.append(obj)
        for v in obj.values():
            out += _walk(v)
    elif isinstance(obj, list):
        for v in obj:
            out += _walk(v)
    return out


def test_setting_check_rejects_renamed_settings() -> None:
    # The env-var test above is only worth something if an unknown or renamed name fails it.
    assert _setting_exists("REMEDIATION_BROKER__REDIS_URL")
    assert _setting_exists("REMEDIATION_MEMORY__JOURNAL")
    assert not _setting_exists("REMEDIATION_BROKER__REDIS_URI")
    assert not _setting_exists("REMEDIATION_SIMULATOR__JOURNAL")
    assert not _setting_exists("REMEDIATION_SLURM__BACKEND__X")


# --------------------------------------------------------------------------- docker-compose.yml

COMPOSE = ROOT / "docker-compose.yml"


def _compose() -> dict[str, Any]:
    (doc,) = _docs(COMPOSE)
    return doc["services"]


def _cli() -> Any:
    from typer.main import get_command

    from remediation.cli.main import app

    return get_command(app)


def _argv_problem(argv: list[str]) -> str | None:
    """Parse argv the way the `remediation` console script would, without running it."""
    cmd, args = _cli(), list(argv)
    while hasattr(cmd, "commands"):  # a group: descend into the named subcommand
        if not args or args[0] not in cmd.commands:
            return f"{argv}: no command {args[:1]} in {sorted(cmd.commands)}"
        cmd = cmd.commands[args.pop(0)]
    try:
        cmd.make_context(argv[0], list(args))
    except Exception as exc:  # click's UsageError family (typer vendors click)
        return f"{argv}: {exc}"
    if argv[0] == "watch" and not (ROOT / "watchers" / argv[1] / "watcher.py").exists():
        return f"{argv}: no watcher {argv[1]!r}"
    return None


def test_argv_check_rejects_bad_commands() -> None:
    assert _argv_problem(["api", "--host", "0.0.0.0", "--port", "8080"]) is None
    assert _argv_problem(["db", "upgrade"]) is None
    assert _argv_problem(["api", "--hots", "0.0.0.0"])
    assert _argv_problem(["db", "migrate"])
    assert _argv_problem(["watcher", "slurm"])
    assert _argv_problem(["watch", "lsf"])


# `sh -c '. ENV_FILE && exec PROGRAM "$$@"' --`: source a file of `export` lines, then exec PROGRAM
# with the service's command as its arguments ($$ is compose's escape for a literal $).
WRAPPER = re.compile(r'(?P<env_files>(?:\. /\S+ && )+)exec (?P<program>[\w.-]+) "\$\$@"')
SIMULATOR = ["python", "-m", "remediation.simulator.cluster"]


def _entrypoint_program(entrypoint: list[str]) -> tuple[list[str], tuple[str, ...] | None]:
    """(the program an entrypoint runs the command with, the env files it sources first, if any)."""
    if entrypoint[:2] == ["sh", "-c"]:
        match = WRAPPER.fullmatch(entrypoint[2]) if len(entrypoint) == 4 else None
        if match is None or entrypoint[3] != "--":  # without "--", the first argument would be $0
            raise ValueError(f"not a wrapper this test understands: {entrypoint}")
        return [match["program"]], tuple(re.findall(r"\. (/\S+) && ", match["env_files"]))
    return entrypoint, None


def _compose_invocations() -> dict[str, tuple[list[str], list[str]]]:
    """Each service of our image: (the program it runs, its arguments). A service without an
    entrypoint runs the image's ENTRYPOINT (the Dockerfile's default stage)."""
    out = {}
    for name, svc in _compose().items():
        if svc.get("image") != "node-remediation:dev":
            continue
        program, _ = _entrypoint_program(svc.get("entrypoint") or _dockerfile_stages()[None])
        out[name] = (program, list(svc.get("command") or []))
    return out


def _simulator_args(argv: list[str]) -> argparse.Namespace:
    from remediation.simulator.standalone import build_parser

    parser = build_parser()
    parser.error = _raise  # type: ignore[method-assign]  # argparse exits on a bad option: fail instead
    return parser.parse_args(argv)


def _raise(message: str) -> NoReturn:
    raise ValueError(message)


def _invocation_problem(program: list[str], argv: list[str]) -> str | None:
    if program == ["remediation"]:
        return _argv_problem(argv)
    if program == SIMULATOR:
        try:
            _simulator_args(argv)
        except ValueError as exc:
            return f"{argv}: {exc}"
        return None
    return f"{program}: neither the remediation console script nor the simulator"


def test_invocation_check_rejects_bad_entrypoints_and_arguments() -> None:
    good = ["sh", "-c", '. /sim/simulator.env && exec remediation "$$@"', "--"]
    assert _entrypoint_program(good) == (["remediation"], ("/sim/simulator.env",))
    both = ["sh", "-c", '. /sim-a/simulator.env && . /sim-b/simulator.env && exec remediation "$$@"', "--"]
    assert _entrypoint_program(both) == (["remediation"], ("/sim-a/simulator.env", "/sim-b/simulator.env"))
    for bad in (
        ["sh", "-c", '. /sim-a/simulator.env; . /sim-b/simulator.env && exec remediation "$$@"', "--"],
        ["sh", "-c", '. /sim/simulator.env && exec remediation "$$@"'],  # no "--": the command loses an arg
        ["sh", "-c", '. /sim/simulator.env && exec remediation "$@"', "--"],  # compose would interpolate $@
        ["sh", "-c", 'exec remediation "$$@"', "--"],  # loads nothing
        ["sh", "-c", '. /sim/simulator.env; exec remediation "$$@"', "--"],  # runs on without the file
    ):
        with pytest.raises(ValueError):
            _entrypoint_program(bad)
    assert _invocation_problem(["remedy"], ["worker"])
    assert _invocation_problem(SIMULATOR, ["--bind", "0.0.0.0", "--replay"]) is None
    assert _invocation_problem(SIMULATOR, ["--bnd", "0.0.0.0"])
    assert _invocation_problem(SIMULATOR, ["--base-port", "seven"])
    assert _invocation_problem(["python", "-m", "remediation.simulator.clusters"], [])


def test_compose_commands_parse() -> None:
    invocations = _compose_invocations()
    assert len(invocations) >= 7
    problems = [p for program, argv in invocations.values() if (p := _invocation_problem(program, argv))]
    assert not problems, problems


def test_compose_long_running_services_have_health_checks() -> None:
    services = _compose()
    one_shot = {"migrate", "migrate-clusters"}
    missing = sorted(n for n, svc in services.items() if n not in one_shot and "healthcheck" not in svc)
    assert not missing, f"no healthcheck: {missing}"
    gated = {n for n, svc in services.items() if "migrate" in (svc.get("depends_on") or {})}
    assert {"worker", "beat", "watcher-slurm", "watcher-kube", "api"} <= gated
    # The processes' checks ask their own health endpoint (the one the Kubernetes probes use), on the
    # port the shared environment sets.
    for name in ("worker", "beat", "watcher-slurm", "watcher-kube"):
        port = services[name]["environment"]["REMEDIATION_HEALTH__PORT"]
        assert f"http://127.0.0.1:{port}/readyz" in " ".join(services[name]["healthcheck"]["test"]), name


CLUSTER_SERVICES = {"worker", "beat", "watcher-slurm", "watcher-kube", "api"}


def test_compose_runs_against_the_simulated_cluster() -> None:
    """The simulator service serves the cluster under its service name and writes its settings into
    the shared volume; every service that talks to the cluster sources them, after the simulator is
    healthy, and nothing falls back to the in-memory backends."""
    services = _compose()
    sim = services["simulator"]
    assert sim.get("entrypoint") == SIMULATOR
    args = _simulator_args(sim["command"])
    assert (args.bind, args.advertise, args.replay) == ("0.0.0.0", "simulator", True)
    assert args.base_port > 0 and args.state_dir is not None
    env_file = f"{args.state_dir}/simulator.env"
    assert f"sim:{args.state_dir}" in sim["volumes"]
    check = " ".join(sim["healthcheck"]["test"])
    assert env_file in check and f"127.0.0.1:{args.base_port}/" in check  # the kube-apiserver port

    wrapped = {}
    for name, svc in services.items():
        if svc.get("entrypoint") and not svc.get("profiles"):
            program, sourced = _entrypoint_program(svc["entrypoint"])
            if sourced is not None:
                wrapped[name] = (program, sourced, svc)
    assert set(wrapped) == CLUSTER_SERVICES
    for name, (program, sourced, svc) in wrapped.items():
        assert program == ["remediation"] and sourced == (env_file,), name
        assert f"sim:{args.state_dir}:ro" in svc["volumes"], name
        assert svc["depends_on"].get("simulator") == {"condition": "service_healthy"}, name
    commands = {tuple(services[n]["command"][:2]) for n in CLUSTER_SERVICES}
    assert {("watch", "slurm"), ("watch", "kube")} <= commands

    for name, svc in services.items():
        for key, value in (svc.get("environment") or {}).items():
            assert not key.startswith("REMEDIATION_MEMORY__"), (name, key)
            assert not (key.endswith("__BACKEND") and value in ("memory", "noop")), (name, key, value)


def test_compose_ships_no_token_and_publishes_on_loopback_only() -> None:
    with pytest.raises(MissingVariable, match="REMEDIATION_ADMIN_TOKEN"):
        compose({})  # `docker compose up` without a token stops here
    token = "a-token-the-operator-chose"
    services = compose({"REMEDIATION_ADMIN_TOKEN": token})["services"]
    assert json.loads(services["api"]["environment"]["REMEDIATION_API__ADMIN_TOKENS"]) == [token]
    assert load_settings(api={"admin_tokens": [token]}).api.admin_tokens  # long enough to load
    for name, svc in services.items():
        for port in svc.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)
        if name not in ("api", "api-clusters"):  # only the APIs hold a token
            assert not [k for k in svc.get("environment") or {} if k.startswith("REMEDIATION_API__")], name


def test_the_simulator_writes_only_real_settings() -> None:
    """What compose's services source is the simulator's settings_overrides: each a real setting, and
    together valid for the advertised, non-loopback host (vm.azure_test_host names it)."""
    from remediation.settings import load_settings
    from remediation.simulator.cluster import Listen, SimCluster

    with SimCluster(2, listen=Listen(advertise="simulator")) as sim:
        overrides = sim.settings_overrides()
        kwargs = sim.settings_kwargs()
    unknown = sorted(k for k in overrides if not _setting_exists(k))
    assert not unknown
    assert overrides["REMEDIATION_MACHINE__AZURE_TEST_HOST"] == "simulator"
    assert all(
        "://simulator:" in overrides[k] for k in overrides if k.endswith(("_URL", "_ENDPOINT", "__HOST"))
    )
    settings = load_settings(**kwargs)  # slurm.rest_token over http:// to "simulator" would be refused
    assert settings.slurm.rest_url is not None and settings.slurm.rest_url.startswith("https://simulator:")
    assert settings.machine.azure_endpoint is not None and settings.machine.azure_endpoint.startswith(
        "https://simulator:"
    )


def test_compose_flower_loads_our_celery_app() -> None:
    """Flower sees our queues only through our app's transport options (global_keyprefix)."""
    flower = _compose().get("flower")
    if flower is None:
        return
    assert flower.get("profiles") == ["flower"]
    target = flower["build"]["target"]
    stages = _dockerfile_stages()
    assert target in stages, f"Dockerfile has no stage {target!r}"
    entrypoint = stages[target]
    assert entrypoint[entrypoint.index("-A") + 1] == "remediation.workers.celery_app" and "flower" in entrypoint
    # The default build target (compose's `build: .`) must still be the application image.
    assert stages[None] == ["remediation"]


def _dockerfile_stages() -> dict[str | None, list[str]]:
    """Each stage's effective ENTRYPOINT, by stage name; the last stage under None."""
    import json

    stages: dict[str | None, list[str]] = {}
    current: str | None = None
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        words = line.split()
        if words[:1] == ["FROM"]:
            base = words[1]
            current = words[3] if len(words) > 3 and words[2].upper() == "AS" else f"#{len(stages)}"
            stages[current] = list(stages.get(base, []))
        elif words[:1] == ["ENTRYPOINT"]:
            stages[current] = json.loads(line.split(None, 1)[1])
    stages[None] = stages[current]
    return stages


# ------------------------------------------------------------------------ kustomize overlays

OVERLAYS = sorted(p.name for p in (ROOT / "deploy/overlays").iterdir() if (p / "kustomization.yaml").exists())
VM_BACKEND = {"gcp": "gce", "azure": "azure", "aws": "aws"}
IDENTITY_ANNOTATION = {
    "gcp": "iam.gke.io/gcp-service-account",
    "azure": "azure.workload.identity/client-id",
    "aws": "eks.amazonaws.com/role-arn",
}
NAMESPACE = "node-remediation"
# Custom resources: not in the Kubernetes schemas; checked structurally instead.
CRD_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
# The oldest Kubernetes these manifests target, and the newest the schema package ships.
SCHEMA_VERSIONS = ["1.27", "latest"]
# What each workload's containers probe. A change here is a decision: say why in the manifest.
PROBES = {
    "remediation-api": {"readinessProbe", "livenessProbe"},
    "remediation-worker": {"readinessProbe", "livenessProbe"},
    "remediation-beat": {"readinessProbe", "livenessProbe"},
    "remediation-watcher-slurm": {"readinessProbe", "livenessProbe"},
    "remediation-watcher-kube": {"readinessProbe", "livenessProbe"},
}
# The processes that serve /livez, /readyz and /metrics on the health port (workers/health.py,
# watchers/health.py); the API serves its own /healthz and /metrics.
HEALTH_SERVERS = {
    "remediation-worker",
    "remediation-beat",
    "remediation-watcher-slurm",
    "remediation-watcher-kube",
}
# Each component's RBAC, (apiGroup, resource, verb), by its ServiceAccount and where it holds: the whole
# cluster or one namespace. Exactly what its code calls (remediation/adapters/kube for the workers, which
# find and evict the pods of a Node in any namespace; watchers/kube*.py for the Kubernetes watcher, which
# lists the slurmd pods in kube.pod_namespace only).
CLUSTER = "(cluster)"
SLURM_NAMESPACE = "slurm"  # kube.pod_namespace in deploy/base/config.yaml
RBAC = {
    ("remediation-worker", CLUSTER): {("", "nodes", "get"), ("", "nodes", "patch")},
    # kube.workload_namespaces in deploy/base/config.yaml: the pods evicted from a Node, listed there only
    ("remediation-worker", SLURM_NAMESPACE): {("", "pods", "list"), ("", "pods/eviction", "create")},
    ("remediation-watcher-kube", CLUSTER): {("", "nodes", "list"), ("", "nodes", "watch")},
    ("remediation-watcher-kube", SLURM_NAMESPACE): {("", "pods", "list")},
}
ALLOWED_RBAC = set().union(*RBAC.values())
# Each component's Secret and the keys it holds: the settings its process reads (watchers/*.py,
# workers/, remediation/api; the Slurm watcher and the workers talk to slurmrestd, only the workers
# notify, only the API checks tokens, nobody but the workers and the API opens the database). The
# init containers' migration reads remediation-migrate, which may name a database role allowed DDL.
SECRET_KEYS = {
    "remediation-worker": {
        "REMEDIATION_DATABASE__URL",
        "REMEDIATION_BROKER__REDIS_URL",
        "REMEDIATION_SLURM__REST_TOKEN",
        "REMEDIATION_SLURM__REST_USER",
        "REMEDIATION_NOTIFY__WEBHOOK_URL",
    },
    "remediation-watcher-slurm": {
        "REMEDIATION_BROKER__REDIS_URL",
        "REMEDIATION_SLURM__REST_TOKEN",
        "REMEDIATION_SLURM__REST_USER",
    },
    "remediation-watcher-kube": {"REMEDIATION_BROKER__REDIS_URL"},
    "remediation-beat": {"REMEDIATION_BROKER__REDIS_URL"},
    "remediation-api": {
        "REMEDIATION_DATABASE__URL",
        "REMEDIATION_BROKER__REDIS_URL",
        "REMEDIATION_API__ADMIN_TOKENS",
        "REMEDIATION_API__READ_TOKENS",
        "REMEDIATION_API__SESSION_KEY",
    },
    "remediation-migrate": {"REMEDIATION_DATABASE__URL"},
}
OPTIONAL_SECRET_KEYS = {("remediation-worker", "REMEDIATION_NOTIFY__WEBHOOK_URL")}


@functools.cache
def _render(overlay: str) -> tuple[dict[str, Any], ...]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl 1.21+ is not installed (scripts/setup.sh installs it, see scripts/kubectl.sh)")
    out = subprocess.run(
        [kubectl, "kustomize", str(ROOT / "deploy/overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)


def _of(objs: tuple[dict[str, Any], ...], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def _workloads(objs: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob")]


def _pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec = workload["spec"]
    if workload["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    return spec["template"]["spec"]


def _pod_labels(workload: dict[str, Any]) -> dict[str, str]:
    return workload["spec"]["template"].get("metadata", {}).get("labels", {})


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, "only matchLabels selectors are checked here"
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def test_overlays_exist() -> None:
    assert OVERLAYS == sorted(VM_BACKEND)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders(overlay: str) -> None:
    objs = _render(overlay)
    kinds = {o["kind"] for o in objs}
    assert {
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "NetworkPolicy",
        "ServiceMonitor",
        "PodMonitor",
        "PrometheusRule",
    } <= kinds
    assert {o["metadata"]["name"] for o in _workloads(objs)} == set(PROBES)
    cluster_scoped = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
    granted_in = {scope for _, scope in RBAC}  # a Role and its binding sit where they grant
    misplaced = [
        o["metadata"]["name"]
        for o in objs
        if o["kind"] not in cluster_scoped and o["metadata"].get("namespace") != NAMESPACE
        and not (o["kind"] in ("Role", "RoleBinding") and o["metadata"].get("namespace") in granted_in)
    ]
    assert not misplaced


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rendered_objects_validate_against_kubernetes_schemas(overlay: str, version: str) -> None:
    import kubernetes_validate

    if version == "latest":
        version = kubernetes_validate.latest_version()
    errors = []
    for obj in _render(overlay):
        if obj["kind"] in CRD_KINDS:
            continue
        try:
            # strict: unknown fields (a typo such as `readinessprobe`) are errors, not ignored.
            kubernetes_validate.validate(obj, version, strict=True)
        except (kubernetes_validate.ValidationError, kubernetes_validate.SchemaNotFoundError) as exc:
            errors.append(f"{obj['kind']}/{obj['metadata']['name']}: {exc}")
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_service_monitor_scrapes_the_api_metrics(overlay: str) -> None:
    objs = _render(overlay)
    (monitor,) = _of(objs, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(monitor["spec"]) <= {"selector", "endpoints", "namespaceSelector", "jobLabel"}
    services = [
        s
        for s in _of(objs, "Service")
        if _selects(monitor["spec"]["selector"], s["metadata"].get("labels", {}))
    ]
    assert [s["metadata"]["name"] for s in services] == ["remediation-api"]
    port_names = {p["name"] for p in services[0]["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in port_names and endpoint["path"] == "/metrics"
    # The processes' own /metrics (watchers, workers, beat) through their pods' health port.
    (pods,) = _of(objs, "PodMonitor")
    assert set(pods["spec"]) <= {"selector", "podMetricsEndpoints", "namespaceSelector", "jobLabel"}
    scraped = {
        w["metadata"]["name"] for w in _workloads(objs) if _selects(pods["spec"]["selector"], _pod_labels(w))
    }
    assert scraped == HEALTH_SERVERS
    for workload in _workloads(objs):
        if workload["metadata"]["name"] in scraped:
            (container,) = _pod_spec(workload)["containers"]
            ports = {p["name"] for p in container.get("ports", [])}
            for endpoint in pods["spec"]["podMetricsEndpoints"]:
                assert endpoint["port"] in ports and endpoint["path"] == "/metrics"


def _rbac_grants(rules: list[dict[str, Any]]) -> set[tuple[str, ...]]:
    grants: set[tuple[str, ...]] = set()
    for rule in rules:
        for key in set(rule) - {"apiGroups", "resources", "verbs"}:
            grants.add((key, repr(rule[key])))  # resourceNames, nonResourceURLs: never granted
        for group in rule.get("apiGroups", []):
            for resource in rule.get("resources", []):
                for verb in rule.get("verbs", []):
                    grants.add((group, resource, verb))
    return grants


def _all_rbac(objs: tuple[dict[str, Any], ...]) -> set[tuple[str, ...]]:
    grants: set[tuple[str, ...]] = set()
    for role in _of(objs, "ClusterRole") + _of(objs, "Role"):
        if "aggregationRule" in role:
            grants.add(("aggregationRule", role["metadata"]["name"]))
        grants |= _rbac_grants(role.get("rules", []))
    return grants


@pytest.mark.parametrize(
    "extra",
    [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["delete"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]},
        {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "update"]},
        {"nonResourceURLs": ["/metrics"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["nodes"], "resourceNames": ["n1"], "verbs": ["get"]},
    ],
    ids=["node-delete", "pod-delete", "secrets", "wildcard", "leases", "non-resource-url", "resource-names"],
)
def test_rbac_check_catches_extra_grants(extra: dict[str, Any]) -> None:
    role = {
        "kind": "ClusterRole",
        "metadata": {"name": "x"},
        "rules": [
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]},
            extra,
        ],
    }
    assert _all_rbac((role,)) - ALLOWED_RBAC


def _granted(objs: tuple[dict[str, Any], ...]) -> dict[tuple[str, str], set[tuple[str, ...]]]:
    """What each of our ServiceAccounts may do, and where: a ClusterRoleBinding grants cluster-wide, a
    RoleBinding (to a Role or a ClusterRole) only in its own namespace."""
    def scope(o: dict[str, Any]) -> str:
        return o["metadata"].get("namespace", CLUSTER) if o["kind"] in ("Role", "RoleBinding") else CLUSTER

    roles = {(r["kind"], scope(r), r["metadata"]["name"]): r for r in _of(objs, "ClusterRole") + _of(objs, "Role")}
    granted: dict[tuple[str, str], set[tuple[str, ...]]] = {}
    for binding in _of(objs, "ClusterRoleBinding") + _of(objs, "RoleBinding"):
        kind = binding["roleRef"]["kind"]
        role = roles.get((kind, scope(binding) if kind == "Role" else CLUSTER, binding["roleRef"]["name"]))
        assert role is not None, f"{binding['metadata']['name']} binds a role we do not ship in its namespace"
        for subject in binding["subjects"]:
            assert subject["kind"] == "ServiceAccount" and subject["namespace"] == NAMESPACE, subject
            granted.setdefault((subject["name"], scope(binding)), set()).update(_rbac_grants(role.get("rules", [])))
    return granted


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rbac_grants_exactly_what_the_adapters_use(overlay: str) -> None:
    objs = _render(overlay)
    assert _all_rbac(objs) == ALLOWED_RBAC
    assert _granted(objs) == RBAC


VALIDATION_NAMESPACE = "node-remediation-validation"
# The kubernetes validation (deploy/components/validation-kubernetes): the workers run check Jobs in
# their own namespace and read their pods and logs there, and nowhere else (remediation/adapters/kube/validator.py).
VALIDATION_RBAC = {
    ("remediation-worker", VALIDATION_NAMESPACE): {
        ("batch", "jobs", "create"),
        ("batch", "jobs", "get"),
        ("batch", "jobs", "delete"),
        ("", "pods", "list"),
        ("", "pods/log", "get"),
    },
}


def _with_validation(overlay: str, tmp_path: Path, component: str = "validation-kubernetes") -> tuple[dict[str, Any], ...]:
    """An overlay of ours with a component added (the validation's by default), as deploy/README.md
    says to."""
    here = tmp_path / "overlay"
    here.mkdir()
    rel = lambda p: os.path.relpath(p, here)  # noqa: E731 - kustomize takes relative paths only
    (here / "kustomization.yaml").write_text(
        f"resources: [{rel(ROOT / 'deploy/overlays' / overlay)}]\n"
        f"components: [{rel(ROOT / 'deploy/components' / component)}]\n"
    )
    out = subprocess.run([shutil.which("kubectl") or "kubectl", "kustomize", str(here)], capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_validation_component_grants_jobs_in_its_namespace_only(overlay: str, tmp_path: Path) -> None:
    objs = _with_validation(overlay, tmp_path)
    assert _granted(objs) == {**RBAC, **VALIDATION_RBAC}
    (ns,) = [o for o in _of(objs, "Namespace") if o["metadata"]["name"] == VALIDATION_NAMESPACE]
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    (own,) = [o for o in _of(objs, "Namespace") if o["metadata"]["name"] == NAMESPACE]
    assert own["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert Settings().validation.kube_namespace == VALIDATION_NAMESPACE
    for workload in _workloads(objs):
        env = {e["name"]: e.get("value") for e in _pod_spec(workload)["containers"][0]["env"]}
        assert env["REMEDIATION_VALIDATION__BACKEND"] == "kubernetes", workload["metadata"]["name"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_high_availability_component_points_every_process_at_the_sentinels(
    overlay: str, tmp_path: Path
) -> None:
    """Each Deployment finds Redis through the sentinels and waits for a replica; the settings it
    renders load; three workers; the sentinels' port is open; RBAC and Secrets keys are unchanged."""
    objs = _with_validation(overlay, tmp_path, "high-availability")
    assert _granted(objs) == RBAC
    for workload in _workloads(objs):
        env = {e["name"]: e for e in _pod_spec(workload)["containers"][0]["env"]}
        values = {k: e["value"] for k, e in env.items() if "value" in e and k.startswith("REMEDIATION_BROKER__")}
        broker = load_settings(broker={"sentinel": {"addresses": json.loads(
            values["REMEDIATION_BROKER__SENTINEL__ADDRESSES"])}}).broker
        assert broker.sentinel.enabled and len(broker.sentinel.addresses) == 3, workload["metadata"]["name"]
        assert values["REMEDIATION_BROKER__REPLICA_ACKS"] == "1"
        assert env["REMEDIATION_BROKER__SENTINEL__PASSWORD"]["valueFrom"]["secretKeyRef"]["optional"] is True
    (worker,) = [w for w in _workloads(objs) if w["metadata"]["name"] == "remediation-worker"]
    assert worker["spec"]["replicas"] == 3
    (policy,) = [p for p in _of(objs, "NetworkPolicy") if p["metadata"]["name"] == "node-remediation"]
    assert {"protocol": "TCP", "port": 26379} in [port for rule in policy["spec"]["egress"]
                                                   for port in rule.get("ports", [])]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_checkpoint_pods_component_grants_pods_patch_and_nothing_more(overlay: str, tmp_path: Path) -> None:
    """workflow.checkpoint_pods annotates pods (remediation/adapters/kube/adapter.py, request_checkpoint):
    pods patch for the workers, in the namespace their pods list is; no exec, no delete."""
    objs = _with_validation(overlay, tmp_path, "checkpoint-pods")
    worker = ("remediation-worker", SLURM_NAMESPACE)
    assert _granted(objs) == {**RBAC, worker: RBAC[worker] | {("", "pods", "patch")}}
    for workload in _workloads(objs):
        env = {e["name"]: e.get("value") for e in _pod_spec(workload)["containers"][0]["env"]}
        assert env["REMEDIATION_WORKFLOW__CHECKPOINT_PODS"] == "true", workload["metadata"]["name"]


def test_rbac_check_catches_a_grant_in_the_wrong_place() -> None:
    """The watcher's pod list held cluster-wide (the grant it had) is caught, not only an extra verb."""
    wide = {"kind": "ClusterRole", "metadata": {"name": "w"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]}
    binding = {"kind": "ClusterRoleBinding", "metadata": {"name": "w"}, "roleRef": {"kind": "ClusterRole", "name": "w"},
               "subjects": [{"kind": "ServiceAccount", "name": "remediation-watcher-kube", "namespace": NAMESPACE}]}
    assert _granted((wide, binding)) == {("remediation-watcher-kube", CLUSTER): {("", "pods", "list")}}


def test_the_pod_grants_are_in_the_namespaces_listed() -> None:
    (config,) = _docs(ROOT / "deploy/base/config.yaml")
    kube = yaml.safe_load(config["data"]["config.yaml"])["kube"]
    assert kube["pod_namespace"] == SLURM_NAMESPACE and kube["workload_namespaces"] == [SLURM_NAMESPACE]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_component_has_its_own_service_account(overlay: str) -> None:
    objs = _render(overlay)
    accounts = {sa["metadata"]["name"] for sa in _of(objs, "ServiceAccount")}
    used = {w["metadata"]["name"]: _pod_spec(w).get("serviceAccountName") for w in _workloads(objs)}
    assert all(used.values()), f"a workload runs as the namespace's default ServiceAccount: {used}"
    assert len(set(used.values())) == len(used), f"components share a ServiceAccount: {used}"
    assert set(used.values()) == accounts, "a ServiceAccount nobody uses, or one we do not ship"
    # Each runs as the account named for it (so RBAC and the cloud identity read plainly).
    assert all(account == name for name, account in used.items()), used


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_component_reads_only_its_own_secret_keys(overlay: str) -> None:
    objs = _render(overlay)
    read: dict[str, set[str]] = {}
    for workload in _workloads(objs):
        name, pod = workload["metadata"]["name"], _pod_spec(workload)
        for c in pod.get("initContainers", []) + pod["containers"]:
            # No envFrom: a Secret loaded whole would hand a process keys it does not use.
            assert not any("secretRef" in e for e in c.get("envFrom", [])), f"{name}/{c['name']}: envFrom"
            for env in c.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref is None:
                    continue
                assert env["name"] == ref["key"], f"{name}/{c['name']}: {env['name']} from key {ref['key']}"
                read.setdefault(ref["name"], set()).add(ref["key"])
                assert bool(ref.get("optional")) == ((ref["name"], ref["key"]) in OPTIONAL_SECRET_KEYS), ref
                # A component's own Secret, or the migration's (in the migrate init container only).
                own = f"remediation-{c['name']}" if c["name"] == "migrate" else name
                assert ref["name"] == own, f"{name}/{c['name']} reads Secret {ref['name']}"
    assert read == SECRET_KEYS


def test_readme_creates_exactly_the_secrets_the_manifests_read() -> None:
    """deploy/README.md's `kubectl create secret` commands make each Secret with exactly its keys."""
    text = (ROOT / "deploy/README.md").read_text().split(MANY_CLUSTERS)[0]
    made = _secrets_made(text)
    optional = {(n, k) for n, k in OPTIONAL_SECRET_KEYS}
    required = {name: {k for k in keys if (name, k) not in optional} for name, keys in SECRET_KEYS.items()}
    assert set(made) == set(SECRET_KEYS)
    for name, keys in made.items():
        assert required[name] <= keys <= SECRET_KEYS[name], (name, keys)


MANY_CLUSTERS = "## Many clusters"


def _secrets_made(text: str) -> dict[str, set[str]]:
    """The Secrets ``text``'s `kubectl create secret` commands make, and each one's keys."""
    made: dict[str, set[str]] = {}
    for block in re.findall(
        r"kubectl -n node-remediation create secret generic (\S+)((?:[^\n]*\\\n)*[^\n]*)", text
    ):
        name, rest = block
        keys = set(re.findall(r"--from-literal=(REMEDIATION_[A-Z_]+)=", rest))
        keys |= set(re.findall(r"--from-file=(REMEDIATION_[A-Z_]+)=", rest))
        made[name] = keys
    return made


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_images_are_pinned_by_digest(overlay: str) -> None:
    images = [
        c["image"]
        for w in _workloads(_render(overlay))
        for c in _pod_spec(w).get("initContainers", []) + _pod_spec(w)["containers"]
    ]
    assert images
    unpinned = [i for i in images if not re.fullmatch(r"[^@\s]+@sha256:[0-9a-f]{64}", i)]
    assert not unpinned, f"not pinned by digest: {unpinned}"
    # The shipped digest is a placeholder, and deploy/README.md says how to set the real one.
    assert "kustomize edit set image node-remediation=" in (ROOT / "deploy/README.md").read_text()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_has_resources_probes_and_a_hardened_security_context(overlay: str) -> None:
    problems: list[str] = []
    for workload in _workloads(_render(overlay)):
        name, pod = workload["metadata"]["name"], _pod_spec(workload)
        sc = pod.get("securityContext", {})
        if not (
            sc.get("runAsNonRoot")
            and sc.get("runAsUser")
            and sc.get("seccompProfile", {}).get("type") == "RuntimeDefault"
        ):
            problems.append(f"{name}: pod securityContext {sc}")
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for c in pod.get("initContainers", []) + pod["containers"]:
            where = f"{name}/{c['name']}"
            res = c.get("resources", {})
            for part in ("requests", "limits"):
                if set(res.get(part, {})) != {"cpu", "memory"}:
                    problems.append(f"{where}: resources.{part} {res.get(part)}")
            csc = c.get("securityContext", {})
            if not (
                csc.get("allowPrivilegeEscalation") is False
                and csc.get("readOnlyRootFilesystem") is True
                and csc.get("capabilities", {}).get("drop") == ["ALL"]
                and not csc.get("capabilities", {}).get("add")
            ):
                problems.append(f"{where}: container securityContext {csc}")
            tmp = [m for m in c.get("volumeMounts", []) if m["mountPath"] == "/tmp"]
            if not (tmp and "emptyDir" in volumes[tmp[0]["name"]]):
                problems.append(f"{where}: no emptyDir on /tmp under a read-only root filesystem")
            probes = {p for p in ("livenessProbe", "readinessProbe", "startupProbe") if p in c}
            if c in pod["containers"] and probes != PROBES[name]:
                problems.append(f"{where}: probes {sorted(probes)}, expected {sorted(PROBES[name])}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_point_at_real_endpoints(overlay: str) -> None:
    objs = _render(overlay)
    (api,) = [w for w in _workloads(objs) if w["metadata"]["name"] == "remediation-api"]
    (container,) = _pod_spec(api)["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    # Liveness must not depend on the database (/healthz is 503 while Postgres is down).
    assert "httpGet" not in container["livenessProbe"]
    port_names = {p["name"] for p in container["ports"]}
    assert container["readinessProbe"]["httpGet"]["port"] in port_names
    # The processes probe their own health endpoint: /livez for liveness, /readyz for readiness, on the
    # port the shipped config serves it on (health.port), never through the broker.
    (cm,) = [o for o in _of(objs, "ConfigMap") if o["metadata"]["name"] == "remediation-config"]
    health = yaml.safe_load(cm["data"]["config.yaml"])["health"]
    assert health["bind"] == "0.0.0.0"  # kubelet and Prometheus reach the pod IP
    for workload in _workloads(objs):
        if workload["metadata"]["name"] not in HEALTH_SERVERS:
            continue
        (container,) = _pod_spec(workload)["containers"]
        ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
        for probe, path in (("livenessProbe", "/livez"), ("readinessProbe", "/readyz")):
            get = container[probe]["httpGet"]
            assert (get["path"], ports[get["port"]]) == (path, health["port"]), workload["metadata"]["name"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_disruption_budgets_cover_workers_and_api(overlay: str) -> None:
    objs = _render(overlay)
    covered = set()
    for pdb in _of(objs, "PodDisruptionBudget"):
        matched = [
            w["metadata"]["name"]
            for w in _of(objs, "Deployment")
            if _selects(pdb["spec"]["selector"], _pod_labels(w))
        ]
        assert len(matched) == 1, f"{pdb['metadata']['name']} selects {matched}"
        covered |= set(matched)
    assert covered == {"remediation-worker", "remediation-api"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policy(overlay: str) -> None:
    objs = _render(overlay)
    policies = _of(objs, "NetworkPolicy")
    # Every pod, the migration Job's included, is under a default policy with no ingress.
    defaults = [
        p for p in policies if p["spec"].get("ingress") == [] and "Ingress" in p["spec"]["policyTypes"]
    ]
    assert defaults
    for workload in _workloads(objs):
        assert any(_selects(p["spec"]["podSelector"], _pod_labels(workload)) for p in defaults), workload[
            "metadata"
        ]["name"]
    # Ingress is opened only to the API pods on the API's port, and to the processes' health port (their
    # /metrics) from the monitoring namespace.
    for policy in policies:
        for rule in policy["spec"].get("ingress", []):
            targets = [w for w in _workloads(objs) if _selects(policy["spec"]["podSelector"], _pod_labels(w))]
            names = {w["metadata"]["name"] for w in targets}
            assert names in ({"remediation-api"}, HEALTH_SERVERS), policy["metadata"]["name"]
            for w in targets:
                ports = {p["containerPort"] for c in _pod_spec(w)["containers"] for p in c.get("ports", [])}
                assert {p["port"] for p in rule["ports"]} <= ports, policy["metadata"]["name"]
            if names == HEALTH_SERVERS:
                assert rule["from"] == [
                    {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
                ]
    egress_ports = {
        p["port"] for pol in policies for rule in pol["spec"].get("egress", []) for p in rule.get("ports", [])
    }
    assert {53, 5432, 6379, 443, 6820} <= egress_ports


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_picks_its_cloud(overlay: str) -> None:
    objs = _render(overlay)
    for deployment in _of(objs, "Deployment"):
        env = {
            e["name"]: e.get("value") for c in _pod_spec(deployment)["containers"] for e in c.get("env", [])
        }
        assert env.get("REMEDIATION_MACHINE__BACKEND") == VM_BACKEND[overlay], deployment["metadata"]["name"]
    identities = {
        sa["metadata"]["name"]: value
        for sa in _of(objs, "ServiceAccount")
        for key, value in (sa["metadata"].get("annotations") or {}).items()
        if key in IDENTITY_ANNOTATION.values()
    }
    # The cloud identity (which can restart VMs) is on the workers' ServiceAccount alone.
    assert list(identities) == ["remediation-worker"], identities
    value = identities["remediation-worker"]
    assert value and "REPLACE_ME" in value, "the identity placeholder must be clearly marked"
    if overlay == "azure":
        opted = {
            d["metadata"]["name"]
            for d in _of(objs, "Deployment")
            if _pod_labels(d).get("azure.workload.identity/use")
        }
        assert opted == {"remediation-worker"}
    # Only pods that call the Kubernetes API carry its token.
    with_token = {
        w["metadata"]["name"]
        for w in _workloads(objs)
        if _pod_spec(w).get("automountServiceAccountToken", True)
    }
    assert with_token == {"remediation-worker", "remediation-watcher-kube"}


def test_the_image_installs_the_project_as_a_wheel_would() -> None:
    """A non-editable install (the migrations ship as their own package), and no sources left beside it
    that could be imported instead (tests/integration/test_demo.py runs the same kind of install)."""
    text = (ROOT / "Dockerfile").read_text()
    assert "pip install --no-cache-dir . " in text and " -e " not in text
    assert "rm -rf /src" in text


def test_compose_tls_overlay_keeps_each_components_user() -> None:
    """docker-compose.tls.yml moves every Redis client to rediss:// with the CA, as the same ACL user."""
    (tls,) = _docs(COMPOSE_TLS)
    for name, svc in _compose().items():
        url = (svc.get("environment") or {}).get("REMEDIATION_BROKER__REDIS_URL")
        if url is None or name == "migrate":  # migrate only upgrades the database
            continue
        if svc.get("profiles") == [MULTI_CLUSTER]:  # its own Redis, plain text (the file's header says)
            continue
        env = tls["services"][name]["environment"]
        assert env["REMEDIATION_BROKER__REDIS_URL"] == url.replace("redis://", "rediss://", 1), name
        assert env["REMEDIATION_BROKER__CA_FILE"].startswith("/tls/"), name
        assert "redis-tls:/tls:ro" in tls["services"][name]["volumes"], name
    assert "--tls-port" in tls["services"]["redis"]["command"] and "0" in tls["services"]["redis"]["command"]


WORKER_USER = f"system:serviceaccount:{NAMESPACE}:remediation-worker"
REQUESTED_AT, DEADLINE = "remediation.gpu.io/checkpoint-requested-at", "remediation.gpu.io/checkpoint-deadline"


def _admit(policy: dict[str, Any], user: str, old: dict[str, Any] | None, new: dict[str, Any],
           params: dict[str, Any] | None = None) -> list[str]:
    """What a kube-apiserver's ValidatingAdmissionPolicy plugin does with a pod UPDATE: the match
    conditions, then the variables in order, then each validation; returns the refusals' messages.
    (The suite's local apiserver is a fake that runs no CEL, so the expressions run here, in cel-python.)"""
    import celpy

    env = celpy.Environment()

    def cel(value: Any) -> Any:  # celpy.json_to_cel reads a bool as an int (bool is an int in Python)
        if isinstance(value, bool):
            return celpy.celtypes.BoolType(value)
        if isinstance(value, dict):
            return celpy.celtypes.MapType({celpy.celtypes.StringType(k): cel(v) for k, v in value.items()})
        if isinstance(value, list):
            return celpy.celtypes.ListType([cel(v) for v in value])
        return value if isinstance(value, celpy.celtypes.BoolType) else celpy.json_to_cel(value)

    def run(expression: str, scope: dict[str, Any]) -> Any:
        return env.program(env.compile(expression)).evaluate({k: cel(v) for k, v in scope.items()})

    scope: dict[str, Any] = {"object": new, "oldObject": old, "request": {"userInfo": {"username": user}},
                             "params": params, "variables": {}}
    if not all(run(c["expression"], scope) for c in policy["spec"].get("matchConditions", [])):
        return []
    for variable in policy["spec"].get("variables", []):
        scope["variables"][variable["name"]] = run(variable["expression"], scope)
    return [v["message"] for v in policy["spec"]["validations"] if not run(v["expression"], scope)]


def _pod(**meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": "llama-0", "namespace": "training", "labels": {"app": "llama"}, **meta},
            "spec": {"nodeName": "gke-a3-0", "containers": [{"name": "main", "image": "trainer@sha256:0"}]}}


@pytest.mark.parametrize(
    ("user", "new", "allowed"),
    [
        (WORKER_USER, _pod(annotations={"team": "llm", REQUESTED_AT: "t0", DEADLINE: "t1"}), True),
        (WORKER_USER, _pod(annotations={"team": "llm"}), True),  # nothing changed
        (WORKER_USER, _pod(annotations={REQUESTED_AT: "t0"}), False),  # removes another annotation
        (WORKER_USER, _pod(annotations={"team": "ops", REQUESTED_AT: "t0"}), False),
        (WORKER_USER, _pod(annotations={"team": "llm", "sidecar.istio.io/inject": "false"}), False),
        (WORKER_USER, {**_pod(annotations={"team": "llm"}), "metadata": {
            **_pod()["metadata"], "annotations": {"team": "llm"}, "labels": {"app": "mine"}}}, False),
        (WORKER_USER, _pod(annotations={"team": "llm"}, finalizers=["x/hold"]), False),
        ("system:serviceaccount:kube-system:some-controller", _pod(labels={"app": "other"}), True),
    ],
    ids=["own-two", "no-change", "drops-other", "changes-other", "adds-other", "label", "finalizer",
         "other-user"],
)
def test_the_checkpoint_policy_lets_the_worker_touch_only_its_two_annotations(
    tmp_path: Path, user: str, new: dict[str, Any], allowed: bool
) -> None:
    objs = _with_validation("gcp", tmp_path, "checkpoint-pods")
    (policy,) = _of(objs, "ValidatingAdmissionPolicy")
    (binding,) = _of(objs, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    assert "namespace" not in policy["metadata"] and policy["spec"]["failurePolicy"] == "Fail"
    names = [c["expression"] for c in policy["spec"]["variables"] if c["name"] == "ours"]
    assert names == [f'["{REQUESTED_AT}", "{DEADLINE}"]']
    assert Settings().kube.annotation_domain == REQUESTED_AT.split("/")[0]  # the keys the adapter writes
    old = _pod(annotations={"team": "llm"})
    assert (_admit(policy, user, old, new) == []) is allowed


CHECK_CASES: dict[str, tuple[Callable[[dict[str, Any]], None], bool]] = {
    "the-check": (lambda spec: None, True),
    "the-reset": (lambda spec: spec["containers"][0].update(command=list(reset_command("0000:3b:00"))), True),
    "reset-all": (lambda spec: spec["containers"][0].update(command=list(reset_command(None))), True),
    "other-image": (lambda spec: spec["containers"][0].update(image="busybox:latest"), False),
    "shell": (lambda spec: spec["containers"][0].update(command=["/bin/sh", "-c", "curl x | sh"]), False),
    "reset-edited": (lambda spec: spec["containers"][0].update(
        command=["/bin/sh", "-c", "rm -rf /host", "nr-gpu-reset", ""]), False),
    "added-args": (lambda spec: spec["containers"][0].update(args=["-r", "1"]), False),
    "capability": (lambda spec: spec["containers"][0]["securityContext"].update(
        capabilities={"add": ["SYS_ADMIN"]}), False),
    "host-pid": (lambda spec: spec.update(hostPID=True), False),
    "host-path": (lambda spec: spec.update(volumes=[{"name": "root", "hostPath": {"path": "/"}}]), False),
    "token": (lambda spec: spec.update(automountServiceAccountToken=True), False),
    "sidecar": (lambda spec: spec["containers"].append({"name": "x", "image": "busybox"}), False),
}


@pytest.mark.parametrize("case", list(CHECK_CASES), ids=list(CHECK_CASES))
def test_the_check_namespace_admits_only_the_pinned_check(tmp_path: Path, case: str) -> None:
    """The check namespace is privileged (the check needs it), so the policy does what Pod Security
    does not: the pod the workers' Job makes passes; the same pod changed in any way that matters is
    refused. The workers read the pinned image from the same ConfigMap the policy reads."""
    objs = _with_validation("gcp", tmp_path)
    (policy,) = [p for p in _of(objs, "ValidatingAdmissionPolicy") if p["metadata"]["name"] == "remediation-check-pods"]
    (binding,) = _of(objs, "ValidatingAdmissionPolicyBinding")
    (pin,) = [c for c in _of(objs, "ConfigMap") if c["metadata"]["name"] == "remediation-check-image"]
    assert binding["spec"]["paramRef"] == {"name": "remediation-check-image", "namespace": NAMESPACE,
                                           "parameterNotFoundAction": "Deny"}
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert re.fullmatch(r"[^@]+@sha256:[0-9a-f]{64}", pin["data"]["image"])
    for workload in _workloads(objs):
        env = {e["name"]: e for e in _pod_spec(workload)["containers"][0]["env"]}
        ref = env["REMEDIATION_VALIDATION__KUBE_IMAGE"]["valueFrom"]["configMapKeyRef"]
        assert ref == {"name": "remediation-check-image", "key": "image"}, workload["metadata"]["name"]
    cfg = Settings(validation={"kube_image": pin["data"]["image"]}).validation
    check = ValidationCheck("gpu-node-1", "nr-check-7-1", tuple(cfg.check_for("gpu-memory")), 60.0, "gpu-memory")
    spec = copy.deepcopy(job_manifest(check, ["gke-a3-0"], cfg,
                                      taint_key="remediation.gpu.io/quarantine")["spec"]["template"]["spec"])
    change, allowed = CHECK_CASES[case]
    change(spec)
    pod = {"metadata": {"name": "nr-check-7-1-x", "namespace": VALIDATION_NAMESPACE}, "spec": spec}
    refusals = _admit(policy, "system:serviceaccount:kube-system:job-controller", None, pod, pin)
    assert (refusals == []) is allowed, refusals


def test_the_check_policy_names_every_configured_check_command() -> None:
    """validation.checks and the policy's list must not drift (a check the policy refuses never runs)."""
    (policy,) = [d for d in _docs(ROOT / "deploy/components/validation-kubernetes/admission.yaml")
                 if d["kind"] == "ValidatingAdmissionPolicy"]
    import celpy

    env = celpy.Environment()
    listed = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    cfg = Settings().validation

    def argvs(name: str) -> set[tuple[str, ...]]:
        return {tuple(str(a) for a in argv) for argv in env.program(env.compile(listed[name])).evaluate({})}

    assert argvs("checks") == {tuple(v) for v in cfg.checks.values()}
    assert argvs("domain_checks") == {tuple(v) for v in cfg.domain_checks.values()}
    fabric_restart = env.program(env.compile(listed["fabric_restart"])).evaluate({})
    assert [str(a) for a in fabric_restart] == cfg.fabric_restart
    assert str(env.program(env.compile(listed["reset"])).evaluate({})) == reset_command(None)[2]


def _ladder_pod(kind: str, cfg: Any) -> dict[str, Any]:
    """The pod of a domain repair's Job as the workers' validator writes it (remediation/domain_repair/
    steps.py builds these checks): a tray's fabric restart, bound to its Node, or a rank of the domain
    check, an Indexed Job's pod placed by affinity to the domain's Nodes."""
    trays = ("gpu-node-0", "gpu-node-1", "gpu-node-2", "gpu-node-3")
    if kind == "fabric-restart":
        check = ValidationCheck(trays[0], "nr-fab-d3-3-0-ab12cd34", tuple(cfg.fabric_restart), 300.0, "imex",
                                purpose="restart fabric", nonce="ab12cd34")
        nodes = [f"gke-a4x-{trays[0][-1]}"]
    else:
        check = ValidationCheck(trays[0], "nr-dom-d3-4-0-ab12cd34", tuple(cfg.domain_check_for("nvswitch")),
                                900.0, "nvswitch", purpose="domain check", nonce="ab12cd34", nodes=trays)
        nodes = [f"gke-a4x-{t[-1]}" for t in trays]
    job = job_manifest(check, nodes, cfg, taint_key="remediation.gpu.io/quarantined")
    spec = copy.deepcopy(job["spec"]["template"]["spec"])
    meta = {"name": f"{check.name}-x", "namespace": VALIDATION_NAMESPACE, "labels": {"job-name": check.name}}
    return {"metadata": meta, "spec": spec}


@pytest.mark.parametrize(("kind", "change", "allowed"), [
    ("fabric-restart", None, True),
    ("domain-check", None, True),
    ("fabric-restart", ["sudo", "-n", "systemctl", "stop", "nvidia-imex"], False),
    ("domain-check", ["srun", "--ntasks-per-node=4", "sh", "-c", "curl x | sh"], False),
], ids=["fabric-restart", "domain-check", "restart-edited", "domain-check-edited"])
def test_the_check_namespace_admits_the_domain_ladders_jobs(
    tmp_path: Path, kind: str, change: list[str] | None, allowed: bool
) -> None:
    """The domain ladder's Jobs (the fabric restart on each tray, the domain check's Indexed Job) run
    in the check namespace too: the policy admits their configured commands as it admits the checks,
    and nothing else in their place."""
    objs = _with_validation("gcp", tmp_path)
    (policy,) = [p for p in _of(objs, "ValidatingAdmissionPolicy") if p["metadata"]["name"] == "remediation-check-pods"]
    (pin,) = [c for c in _of(objs, "ConfigMap") if c["metadata"]["name"] == "remediation-check-image"]
    pod = _ladder_pod(kind, Settings(validation={"kube_image": pin["data"]["image"]}).validation)
    if change is not None:
        pod["spec"]["containers"][0]["command"] = change
    refusals = _admit(policy, "system:serviceaccount:kube-system:job-controller", None, pod, pin)
    assert (refusals == []) is allowed, refusals


# ------------------------------------------------------------------------ many clusters

MULTI = ROOT / "deploy/components/multi-cluster"
# The component's clusters: whether each has Kubernetes, and whether it is reached through its API
# server (a token of its own) rather than the pods' own ServiceAccount.
CLUSTERS = {"east": (True, False), "west": (True, True), "lab": (False, False)}


def _multi(overlay: str, tmp_path: Path) -> tuple[dict[str, Any], ...]:
    return _with_validation(overlay, tmp_path, "multi-cluster")


def _env(workload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in _pod_spec(workload)["containers"][0]["env"]}


def _watchers(objs: tuple[dict[str, Any], ...]) -> dict[str, dict[str, Any]]:
    return {w["metadata"]["name"]: w for w in _workloads(objs) if "watcher" in w["metadata"]["name"]}


def _rendered_config(objs: tuple[dict[str, Any], ...], tmp_path: Path) -> Path:
    (cm,) = [c for c in _of(objs, "ConfigMap") if c["metadata"]["name"] == "remediation-config"]
    path = tmp_path / "config.yaml"
    path.write_text(cm["data"]["config.yaml"])
    return path


def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("REMEDIATION_"):
            monkeypatch.delenv(key)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_multi_cluster_component_runs_one_watcher_set_per_cluster(
    overlay: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Slurm watcher per cluster and a Kubernetes watcher per cluster with Kubernetes, none for
    `default`; each loads its own cluster's settings from the shared config and its own Secret, and is
    given no other cluster's secret; one worker, beat and API serve them all."""
    objs = _multi(overlay, tmp_path)
    watchers = _watchers(objs)
    expected = {f"remediation-watcher-slurm-{c}" for c in CLUSTERS}
    expected |= {f"remediation-watcher-kube-{c}" for c, (kube, _) in CLUSTERS.items() if kube}
    assert set(watchers) == expected
    assert {w["metadata"]["name"] for w in _workloads(objs)} - expected == {
        "remediation-worker", "remediation-beat", "remediation-api"}
    config = _rendered_config(objs, tmp_path)
    for name, workload in watchers.items():
        kind, cluster = name.removeprefix("remediation-watcher-").split("-", 1)
        env = _env(workload)
        assert env["REMEDIATION_CLUSTER__NAME"]["value"] == cluster
        secret_env = {k for k, e in env.items() if "valueFrom" in e}
        foreign = [k for k in secret_env if k.startswith("REMEDIATION_CLUSTERS__")
                   and not k.startswith(f"REMEDIATION_CLUSTERS__{cluster.upper()}__")]
        assert not foreign, f"{name} is handed another cluster's secret: {foreign}"
        _clean(monkeypatch)
        monkeypatch.setenv("REMEDIATION_CONFIG", str(config))
        for key, e in env.items():
            if key != "REMEDIATION_CONFIG":  # the mounted file: here, the rendered one
                monkeypatch.setenv(key, e.get("value") or f"secret-of-{key.lower()}")
        monkeypatch.setenv("REMEDIATION_BROKER__REDIS_URL", "redis://u:p@redis:6379/0")
        watched = load_watched()
        assert watched.cluster.name == cluster
        if kind == "slurm":
            assert watched.slurm.rest_token is not None and watched.slurm.rest_url
        else:
            assert watched.kube.backend == "kubernetes"
            remote = CLUSTERS[cluster][1]
            assert bool(watched.kube.host) == remote == (watched.kube.token is not None), name
            # A watcher that reaches another cluster's API server holds no token of the one it runs in.
            assert _pod_spec(workload).get("automountServiceAccountToken", True) is not remote, name
    _clean(monkeypatch)
    monkeypatch.setenv("REMEDIATION_CONFIG", str(config))
    worker = next(w for w in _workloads(objs) if w["metadata"]["name"] == "remediation-worker")
    for key in _env(worker):
        if key.startswith("REMEDIATION_CLUSTERS__"):
            monkeypatch.setenv(key, "a-secret")
    fleet = load_settings().fleet()
    assert set(fleet) == set(CLUSTERS)
    for cluster, (kube, remote) in CLUSTERS.items():
        one = fleet[cluster]
        assert one.slurm.rest_token is not None, f"the workers have no Slurm token of {cluster}"
        assert (one.kube.backend != "none") == kube and (one.kube.token is not None) == remote, cluster


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_multi_cluster_component_keeps_each_component_to_its_own(overlay: str, tmp_path: Path) -> None:
    """Each watcher reads only its own Secret (named for it) and selects only its own pods; RBAC and
    the other components' Secrets are the base's but for the workers' per-cluster tokens; every
    object validates against the Kubernetes schemas."""
    import kubernetes_validate

    objs = _multi(overlay, tmp_path)
    assert _granted(objs) == RBAC
    workloads = _workloads(objs)
    for workload in workloads:
        name = workload["metadata"]["name"]
        for env in _env(workload).values():
            ref = env.get("valueFrom", {}).get("secretKeyRef")
            if ref is not None:
                assert ref["name"] == name and ref["key"] == env["name"], (name, ref)
        others = [o["metadata"]["name"] for o in workloads
                  if o is not workload and _selects(workload["spec"]["selector"], _pod_labels(o))]
        assert not others, f"{name}'s selector takes the pods of {others}"
    worker = _env(next(w for w in workloads if w["metadata"]["name"] == "remediation-worker"))
    assert set(worker) - {k for k in worker if k.startswith("REMEDIATION_CLUSTERS__")} == (
        SECRET_KEYS["remediation-worker"] - {"REMEDIATION_SLURM__REST_TOKEN", "REMEDIATION_SLURM__REST_USER"}
    ) | {"REMEDIATION_CONFIG"}
    errors = []
    for obj in objs:
        if obj["kind"] not in CRD_KINDS:
            try:
                kubernetes_validate.validate(obj, SCHEMA_VERSIONS[0], strict=True)
            except kubernetes_validate.ValidationError as exc:
                errors.append(f"{obj['kind']}/{obj['metadata']['name']}: {exc}")
    assert not errors, "\n".join(errors)


def _acl_lines(objs: tuple[dict[str, Any], ...]) -> list[str]:
    import base64

    (secret,) = [s for s in _of(objs, "Secret") if s["metadata"]["name"] == "remediation-redis"]
    return base64.b64decode(secret["data"]["users.acl"]).decode().splitlines()


def test_the_multi_cluster_acl_has_a_user_per_watcher_and_keeps_the_others(tmp_path: Path) -> None:
    """One Redis user per watcher Deployment, named for it, writing its own cluster's stream only; the
    base's default-cluster watcher users are gone with their watchers; every other user is the base's,
    word for word (the file is a copy: a change to the base must reach it)."""
    objs = _multi(OVERLAYS[0], tmp_path)
    lines = _acl_lines(objs)
    users = {line.split()[1]: line for line in lines}
    watcher_users = {u for u in users if u.startswith("watcher-")}
    assert watcher_users == {n.removeprefix("remediation-") for n in _watchers(objs)}
    for user in watcher_users:
        kind, cluster = user.removeprefix("watcher-").split("-", 1)
        keys = {w for w in users[user].replace("(", " ").replace(")", " ").split() if w.startswith(("~", "%"))}
        space = f"remediation:cluster:{cluster}"
        assert keys == {f"~{space}:events:{kind}", f"~{space}:leader:{kind}", f"~{space}:leader:{kind}:token"}
    base = (ROOT / "deploy/base/redis/users.acl").read_text().splitlines()
    assert [line for line in base if not line.startswith("user watcher-")] == [
        line for line in lines if not line.startswith("user watcher-")]


def test_the_readme_creates_the_multi_cluster_secrets_the_manifests_read(tmp_path: Path) -> None:
    """deploy/README.md's "Many clusters" commands make each watcher's Secret with exactly the keys
    it reads, and give the workers' Secret each cluster's keys."""
    section = (ROOT / "deploy/README.md").read_text().split(MANY_CLUSTERS)[1].split("\n## ")[0]
    made = _secrets_made(section)
    objs = _multi(OVERLAYS[0], tmp_path)
    read: dict[str, set[str]] = {}
    for workload in _workloads(objs):
        for env in _env(workload).values():
            if (ref := env.get("valueFrom", {}).get("secretKeyRef")) and not ref.get("optional"):
                read.setdefault(ref["name"], set()).add(ref["key"])
    watchers = {n: keys for n, keys in read.items() if "watcher" in n}
    assert {n: made.get(n) for n in watchers} == watchers
    assert made["remediation-worker"] == read["remediation-worker"]


MULTI_CLUSTER = "multi-cluster"  # docker-compose.yml's profile of two simulated clusters


def test_the_compose_multi_cluster_profile_runs_a_watcher_pair_per_simulated_cluster() -> None:
    """Two simulators, each writing its settings as its own entry of `clusters` into its own volume;
    each cluster's watchers source only that cluster's file and name it, as their own Redis user of
    the multi-cluster component's ACL; one worker, beat and API source both; the profile's config
    file lists exactly the simulated clusters; its stack has its own Postgres and Redis."""
    services = {n: s for n, s in _compose().items() if s.get("profiles") == [MULTI_CLUSTER]}
    sims = {n: _simulator_args(s["command"]) for n, s in services.items() if s.get("entrypoint") == SIMULATOR}
    assert {a.cluster for a in sims.values()} == {"east", "west"}
    files = {a.cluster: f"{a.state_dir}/simulator.env" for a in sims.values()}
    for name, args in sims.items():
        assert args.replay and f"sim-{args.cluster}:{args.state_dir}" in services[name]["volumes"]
        assert files[args.cluster] in " ".join(services[name]["healthcheck"]["test"]), name
    (config,) = {s["environment"]["REMEDIATION_CONFIG"] for s in services.values()
                 if "REMEDIATION_CONFIG" in (s.get("environment") or {})}
    mount = f"./deploy/compose:{Path(config).parent}:ro"
    listed = yaml.safe_load((ROOT / "deploy/compose" / Path(config).name).read_text())["clusters"]
    assert [e["name"] for e in listed] == sorted(files)
    acl = {line.split()[1]: line for line in (ROOT / "deploy/components/multi-cluster/redis/users.acl")
           .read_text().splitlines()}  # fmt: skip
    watchers, shared = {}, {}
    for name, svc in services.items():
        if svc.get("entrypoint", [])[:2] != ["sh", "-c"]:
            continue
        program, sourced = _entrypoint_program(svc["entrypoint"])
        assert program == ["remediation"] and mount in svc["volumes"], name
        env = svc["environment"]
        user = urlsplit(env["REMEDIATION_BROKER__REDIS_URL"])
        assert user.hostname == "redis-clusters" and f">{user.password}" in acl[str(user.username)], name
        assert "@postgres-clusters:" in env["REMEDIATION_DATABASE__URL"], name
        if svc["command"][0] == "watch":
            cluster = env["REMEDIATION_CLUSTER__NAME"]
            assert sourced == (files[cluster],) and user.username == f"watcher-{svc['command'][1]}-{cluster}", name
            watchers[name] = cluster
        else:
            assert sourced == tuple(files[c] for c in sorted(files)), name
            shared[name] = svc["command"][0]
    assert sorted(watchers.values()) == ["east", "east", "west", "west"]
    assert sorted(shared.values()) == ["api", "beat", "worker"]
    assert {"postgres-clusters", "redis-clusters", "migrate-clusters"} <= set(services)
