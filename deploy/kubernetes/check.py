"""Checks deploy/kubernetes/sluice.yaml: it parses, and it holds what
docs/cluster.md says (a StatefulSet of cluster members with a volume each,
the admin token from a Secret, readiness from /healthz, time for final
checkpoints). Run by scripts/test.sh."""

import pathlib
import sys

import yaml

path = pathlib.Path(__file__).with_name("sluice.yaml")
documents = [d for d in yaml.safe_load_all(path.read_text()) if d]
kinds = sorted(d["kind"] for d in documents)
assert kinds == ["Service", "Service", "StatefulSet"], kinds
for document in documents:
    assert document.get("apiVersion") and document["metadata"].get("name"), document

statefulset = next(d for d in documents if d["kind"] == "StatefulSet")
spec = statefulset["spec"]
assert spec["replicas"] >= 3, "a cluster that survives a loss"
pod = spec["template"]["spec"]
assert pod["terminationGracePeriodSeconds"] >= 60, "final checkpoints need time"
assert spec["selector"]["matchLabels"] == spec["template"]["metadata"]["labels"]
(container,) = pod["containers"]
args = container["args"]
assert args[0] == "serve", args
for flag in ("--cluster=", "--brokers=", "--data-dir=", "--listen="):
    assert any(a.startswith(flag) for a in args), f"{flag} missing: {args}"
env = {e["name"]: e for e in container["env"]}
assert "secretKeyRef" in env["SLUICE_ADMIN_TOKEN"]["valueFrom"], "the admin token comes from a Secret"
assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
data_dir = next(a.split("=", 1)[1] for a in args if a.startswith("--data-dir="))
mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
claims = {c["metadata"]["name"] for c in spec["volumeClaimTemplates"]}
assert mounts.get(data_dir) in claims, "the data directory is a volume of its own per host"
headless = [d for d in documents if d["kind"] == "Service" and d["spec"].get("clusterIP") == "None"]
assert [d["metadata"]["name"] for d in headless] == [spec["serviceName"]], "serviceName names the headless Service"
print(f"{path.name}: ok", file=sys.stderr)
