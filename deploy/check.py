#!/usr/bin/env python3
"""Checks deploy/ without a cluster: the Helm chart, with PyPI helm-sdkpy (Helm 4's library; no
helm binary exists here), and the kustomize base and overlay, with `kubectl kustomize` and
`kubernetes-validate --strict` against Kubernetes 1.30 and 1.33.

Helm:
- `helm lint` in strict mode (any warning or error fails) with the chart's default values and
  with each examples/*.yaml merged over them, as `helm lint -f FILE` does;
- values that break values.schema.json must fail the lint (the schema is really enforced);
- the chart packages;
- the config.toml the chart renders for each example (the directories and [server] from the
  values, then config.pools) passes `flotilla config check`.

kustomize:
- base and overlays/example render, and every object passes kubernetes-validate --strict for
  each Kubernetes version (CRDs such as ServiceMonitor have no bundled schema: a warning);
- every object carries the recommended app.kubernetes.io/* labels, the pod template too;
- the pod keeps the chart's promises: one replica, Recreate, non-root, read-only root, no
  capabilities, RuntimeDefault seccomp, probes on the metrics port, a Service that keeps a
  draining pod's endpoints, and terminationGracePeriodSeconds = shutdown_grace + 20 s;
- the config.toml in each rendered ConfigMap passes `flotilla config check` (the base has no
  pool, so that must be its only problem).

The Kubernetes guide (docs/deployment.md), followed literally: each `kubectl create
namespace|secret` and `kubectl apply -k` line of its ```sh blocks is run as written in a scratch
copy of the repository (creations with --dry-run=client, apply as `kubectl kustomize`, the
guide's own `cp` and `sed` as they are), every object is validated, and the rendered workloads
may only name namespaces and Secrets (and Secret keys) the guide created. Lines that need a
cluster or a registry (docker, helm install, plugin push, get, label) are listed as not run.

Usage: check.py FLOTILLA_BINARY
"""
import asyncio
import copy
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import tomllib

import helm_sdkpy as helm
import yaml

DEPLOY = pathlib.Path(__file__).resolve().parent
CHART = DEPLOY / "helm" / "flotilla"
KUSTOMIZE = DEPLOY / "kustomize"
KUBERNETES = ["1.30.0", "1.33.0"]
LABELS = [
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/component",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/managed-by",
]
SEVERITY = {1: "info", 2: "warning", 3: "error"}

# Values that values.schema.json must refuse, each with why.
BAD = [
    ({"service": {"type": "Ingress"}}, "service.type outside its enum"),
    ({"server": {"port": "8080"}}, "a port as a string"),
    ({"server": {"metricsPort": 70000}}, "a port out of range"),
    ({"replicas": 2}, "an unknown top-level key (one replica by design)"),
    ({"persistence": {"state": {"size": "lots"}}}, "a size that is not a quantity"),
    ({"apiToken": {"existingSecret": ""}}, "no API token and no existing ConfigMap"),
    ({"secretMounts": [{"name": "gcp", "secretName": "k"}]}, "a secret mount without mountPath"),
    ({"image": {"digest": "latest"}}, "an image digest that is not sha256"),
    ({"probes": {"startup": {"path": "/"}}}, "a startup probe path flotilla does not serve"),
    ({"operators": [{"name": "alice"}]}, "an operator without the Secret of its token"),
    (
        {"operators": [{"name": "alice smith", "existingSecret": "flotilla-operator-alice"}]},
        "an operator name flotilla refuses (a space)",
    ),
]


def merge(base, over):
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def lint(values):
    """Lints a copy of the chart whose values.yaml is `values`; returns the messages."""
    with tempfile.TemporaryDirectory() as tmp:
        chart = pathlib.Path(tmp) / "flotilla"
        shutil.copytree(CHART, chart)
        (chart / "values.yaml").write_text(yaml.safe_dump(values, sort_keys=False))
        result = asyncio.run(helm.Lint(helm.Configuration()).run(str(chart)))
    return [(SEVERITY.get(m["Severity"], m["Severity"]), m["Path"]) for m in result["Messages"] or []]


def rendered_config(values):
    """The config.toml the chart's "flotilla.config" template writes for these values."""
    s = values["server"]
    discovery = values.get("machineDiscovery", {})
    sd_token = (
        f'sd_token = {{ file = "/etc/flotilla/secrets/sd-token/{discovery["key"]}" }}\n'
        if discovery.get("existingSecret")
        else ""
    )
    operators = "".join(
        "\n[[server.operator]]\n"
        f'name = "{o["name"]}"\n'
        f'token = {{ file = "/etc/flotilla/secrets/operators/{i}/{o.get("key") or "token"}" }}\n'
        for i, o in enumerate(values.get("operators") or [])
    )
    return (
        'cache_dir = "/var/cache/flotilla"\n'
        'state_dir = "/var/lib/flotilla"\n\n'
        "[server]\n"
        f'listen = "0.0.0.0:{s["port"]}"\n'
        f'metrics_listen = "0.0.0.0:{s["metricsPort"]}"\n'
        f'token = {{ file = "/etc/flotilla/secrets/api-token/{values["apiToken"]["key"]}" }}\n'
        + sd_token
        + f'shutdown_grace = "{s["shutdownGraceSeconds"]}s"\n'
        + operators
        + "\n"
        + values["config"]["pools"]
    )


def secrets_root(flotilla, tmp):
    """Stand-ins for the files the pod mounts under /etc/flotilla/secrets, so that
    `flotilla config check` can check what the config says of them."""
    root = pathlib.Path(tmp) / "secrets"
    (root / "api-token").mkdir(parents=True)
    (root / "api-token" / "token").write_text("check-token\n")
    # The manifests mount the token Secret with defaultMode 0400: flotilla refuses a token
    # file other users can read.
    (root / "api-token" / "token").chmod(0o400)
    (root / "sd-token").mkdir()
    (root / "sd-token" / "token").write_text("check-sd-token\n")
    (root / "sd-token" / "token").chmod(0o400)
    # Operators' tokens (the examples name at most two), each its own.
    for i in range(2):
        (root / "operators" / str(i)).mkdir(parents=True)
        (root / "operators" / str(i) / "token").write_text(f"check-operator-{i}\n")
        (root / "operators" / str(i) / "token").chmod(0o400)
    (root / "cosign").mkdir()
    subprocess.run(
        [flotilla, "plugin", "generate-key", str(root / "cosign" / "cosign")],
        check=True,
        capture_output=True,
        env=dict(os.environ, COSIGN_PASSWORD="check"),
    )
    (root / "ssh").mkdir()
    (root / "ssh" / "known_hosts").write_text(
        "10.0.0.11 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJdD7y3aLq454yWBdwLWbieU1ebz9/cu7/QEXn9OIeZJ\n"
    )
    return root


def config_check(flotilla, root, text, tmp, expect_no_pool):
    """`flotilla config check` on a config whose secret files live under `root`; with
    `expect_no_pool`, the one problem must be the missing pool. Returns an error or None."""
    path = pathlib.Path(tmp) / "config.toml"
    path.write_text(text.replace("/etc/flotilla/secrets", str(root)))
    out = subprocess.run([flotilla, "config", "check", "-c", str(path)], capture_output=True, text=True)
    problems = [l for l in out.stderr.splitlines() if l.startswith(str(path))]
    if expect_no_pool:
        ok = out.returncode != 0 and len(problems) == 1 and "no [[pool]] defined" in problems[0]
    else:
        ok = out.returncode == 0
    return None if ok else out.stderr.strip()


def check_kustomize(flotilla, root, tmp):
    failed = []
    for name in ["base", "overlays/example"]:
        rendered = subprocess.run(
            ["kubectl", "kustomize", str(KUSTOMIZE / name)], capture_output=True, text=True
        )
        if rendered.returncode != 0:
            failed.append(f"kustomize {name}: {rendered.stderr.strip()}")
            continue
        path = pathlib.Path(tmp) / "rendered.yaml"
        path.write_text(rendered.stdout)
        for version in KUBERNETES:
            out = subprocess.run(
                ["kubernetes-validate", "--strict", "--quiet", "-k", version, str(path)],
                capture_output=True,
                text=True,
            )
            refused = [
                l for l in (out.stdout + out.stderr).splitlines()
                if l.strip() and "Couldn't find schema for kind ServiceMonitor" not in l
            ]
            ok = out.returncode == 0 and not refused
            print(f"kubernetes-validate --strict -k {version}, {name}: {'ok' if ok else refused}")
            if not ok:
                failed.append(f"{name} on {version}: {refused}")
        docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
        problems = []
        for d in docs:
            what = f"{d['kind']}/{d['metadata']['name']}"
            labels = d["metadata"].get("labels", {})
            problems += [f"{what} lacks {l}" for l in LABELS if l not in labels]
            if d["kind"] == "Deployment":
                problems += deployment_problems(d, docs)
            if d["kind"] == "Service" and not d["spec"].get("publishNotReadyAddresses"):
                problems.append(f"{what}: a draining pod would lose its endpoint")
            if d["kind"] == "ConfigMap":
                err = config_check(
                    flotilla, root, d["data"]["config.toml"], tmp, expect_no_pool=name == "base"
                )
                if err:
                    problems.append(f"{what}: flotilla config check: {err}")
        print(f"labels, pod spec and config, {name} ({len(docs)} objects): {'ok' if not problems else problems}")
        failed += [f"{name}: {p}" for p in problems]
    return failed


GUIDE = DEPLOY.parent / "docs" / "deployment.md"


def guide_commands():
    """The lines of the guide's ```sh blocks, continuation lines joined."""
    lines, inside, pending = [], False, ""
    for line in GUIDE.read_text().splitlines():
        if line.startswith("```"):
            inside = line.strip() == "```sh"
            continue
        if not inside or not line.strip() or line.lstrip().startswith("#"):
            continue
        pending += line.rstrip("\\").strip() + " "
        if not line.endswith("\\"):
            lines.append(pending.strip())
            pending = ""
    return lines


def check_guide(tmp):
    """Follows the Kubernetes guide as written; returns the problems."""
    work = pathlib.Path(tmp) / "guide"
    shutil.copytree(DEPLOY, work / "deploy")
    (work / "cosign.pub").write_text("-----BEGIN PUBLIC KEY-----\nstand-in\n-----END PUBLIC KEY-----\n")
    objects, skipped, failed = [], [], []
    for command in guide_commands():
        words = command.split()
        run = None
        if words[:1] in (["cp"], ["sed"]) or words[:2] == ["mkdir", "-p"]:
            run = command
        elif "kubectl" in words[:1] and "create" in words:
            run = command + " --dry-run=client -o yaml"
        elif words[:1] == ["kubectl"] and "apply" in words and "-k" in words:
            run = "kubectl kustomize " + words[words.index("-k") + 1]
        elif words[:2] == ["kubectl", "kustomize"]:
            run = command
        if run is None:
            skipped.append(command)
            continue
        out = subprocess.run(["sh", "-c", run], cwd=work, capture_output=True, text=True)
        if out.returncode != 0:
            failed.append(f"guide: `{command}` failed: {out.stderr.strip()}")
            continue
        if run.startswith("kubectl"):
            objects += [d for d in yaml.safe_load_all(out.stdout) if d]
    print(f"guide: ran {len(guide_commands()) - len(skipped)} commands, not run (cluster or registry): {skipped}")
    namespaces = {o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"}
    secrets = {}
    for o in objects:
        if o["kind"] == "Secret":
            secrets.setdefault(o["metadata"]["name"], set()).update((o.get("data") or {}).keys())
    if not namespaces:
        failed.append("guide: no namespace is created")
    for o in objects:
        ns = o["metadata"].get("namespace")
        if ns and ns not in namespaces:
            failed.append(f"guide: {o['kind']}/{o['metadata']['name']} goes to namespace {ns}, which the guide does not create")
        if o["kind"] not in ("Deployment", "StatefulSet"):
            continue
        pod = o["spec"]["template"]["spec"]
        for v in pod.get("volumes", []):
            name = (v.get("secret") or {}).get("secretName")
            if name and name not in secrets and not v["secret"].get("optional"):
                failed.append(f"guide: volume {v['name']} mounts Secret {name}, which the guide does not create")
            for item in (v.get("secret") or {}).get("items", []):
                if name in secrets and item["key"] not in secrets[name]:
                    failed.append(f"guide: Secret {name} has no key {item['key']}")
        for c in pod.get("containers", []):
            for e in c.get("env", []):
                ref = (e.get("valueFrom") or {}).get("secretKeyRef")
                if ref and not ref.get("optional"):
                    if ref["name"] not in secrets:
                        failed.append(f"guide: env {e['name']} reads Secret {ref['name']}, which the guide does not create")
                    elif ref["key"] not in secrets[ref["name"]]:
                        failed.append(f"guide: Secret {ref['name']} has no key {ref['key']}")
    path = pathlib.Path(tmp) / "guide.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    for version in KUBERNETES:
        out = subprocess.run(
            ["kubernetes-validate", "--strict", "--quiet", "-k", version, str(path)],
            capture_output=True, text=True,
        )
        refused = [l for l in (out.stdout + out.stderr).splitlines()
                   if l.strip() and "Couldn't find schema for kind ServiceMonitor" not in l]
        if out.returncode != 0 or refused:
            failed.append(f"guide on {version}: {refused}")
    print(f"guide: {len(objects)} objects, namespaces {sorted(namespaces)}, secrets {sorted(secrets)}: "
          f"{'ok' if not failed else failed}")
    return failed


def deployment_problems(d, docs):
    spec, pod = d["spec"], d["spec"]["template"]["spec"]
    c = pod["containers"][0]
    out = []
    labels = d["spec"]["template"]["metadata"].get("labels", {})
    out += [f"pod template lacks {l}" for l in LABELS if l not in labels]
    if spec.get("replicas") != 1 or spec.get("strategy", {}).get("type") != "Recreate":
        out.append("not one replica with Recreate")
    sc, psc = c.get("securityContext", {}), pod.get("securityContext", {})
    if not (psc.get("runAsNonRoot") and psc.get("seccompProfile", {}).get("type") == "RuntimeDefault"):
        out.append("pod not non-root with RuntimeDefault seccomp")
    if not (sc.get("readOnlyRootFilesystem") and sc.get("allowPrivilegeEscalation") is False
            and sc.get("capabilities", {}).get("drop") == ["ALL"]):
        out.append("container not read-only, without escalation and capabilities")
    probes = {k: c.get(k, {}).get("httpGet", {}) for k in ["startupProbe", "readinessProbe", "livenessProbe"]}
    if {k: (p.get("path"), p.get("port")) for k, p in probes.items()} != {
        "startupProbe": ("/readyz", "metrics"),
        "readinessProbe": ("/readyz", "metrics"),
        "livenessProbe": ("/healthz", "metrics"),
    }:
        out.append(f"probes: {probes}")
    # terminationGracePeriodSeconds = shutdown_grace + 15 s plugin shutdown + 5 s.
    cm_name = next(v["configMap"]["name"] for v in pod["volumes"] if v["name"] == "config")
    cm = next(x for x in docs if x["kind"] == "ConfigMap" and x["metadata"]["name"] == cm_name)
    grace = tomllib.loads(cm["data"]["config.toml"])["server"]["shutdown_grace"]
    if not grace.endswith("s") or int(grace[:-1]) + 20 != pod.get("terminationGracePeriodSeconds"):
        out.append(f"terminationGracePeriodSeconds {pod.get('terminationGracePeriodSeconds')} "
                   f"is not shutdown_grace {grace} + 20 s")
    return out


def main():
    flotilla = sys.argv[1]
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    failed = []
    cases = [("default values", defaults)] + [
        (f"examples/{p.name}", merge(defaults, yaml.safe_load(p.read_text())))
        for p in sorted((CHART / "examples").glob("*.yaml"))
    ]
    for name, values in cases:
        bad = [m for m in lint(values) if m[0] != "info"]
        print(f"lint --strict, {name}: {'ok' if not bad else bad}")
        if bad:
            failed.append(f"{name}: {bad}")
    for over, why in BAD:
        msgs = lint(merge(defaults, over))
        refused = any(sev == "error" and path == "values.yaml" for sev, path in msgs)
        print(f"schema refuses {why}: {'yes' if refused else 'NO'}")
        if not refused:
            failed.append(f"the schema accepted {why}: {json.dumps(over)}")
    with tempfile.TemporaryDirectory() as tmp:
        pkg = asyncio.run(helm.Package(helm.Configuration()).run(str(CHART), dest_dir=tmp))
        print(f"package: {os.path.basename(str(pkg))}")
        # The rendered config of every case that renders one passes flotilla's own check. The
        # default values carry no pool (yours go in config.pools), so their one problem must be
        # exactly that: everything the chart itself writes is valid.
        root = secrets_root(flotilla, tmp)
        for name, values in cases:
            if values["config"].get("existingConfigMap"):
                continue
            err = config_check(
                flotilla, root, rendered_config(values), tmp, expect_no_pool=name == "default values"
            )
            print(f"flotilla config check, {name}: {'ok' if not err else err}")
            if err:
                failed.append(f"{name}: config check: {err}")
        failed += check_kustomize(flotilla, root, tmp)
        failed += check_guide(tmp)
    if failed:
        print("\nFAILED:\n" + "\n".join(failed), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
