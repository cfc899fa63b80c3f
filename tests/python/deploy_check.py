"""Validates deploy/kubernetes against the Kubernetes API schemas (kubernetes-validate, strict:
unknown fields refused) and prints what the Rust test checks against the `cachet` binary: each
workload's replicas, containers (image, args, env names, ports, probe paths) and the
kustomization's resources. Usage: deploy_check.py DIR"""
import json
import os
import sys

import kubernetes_validate
import yaml

d = sys.argv[1]
kust = yaml.safe_load(open(os.path.join(d, "kustomization.yaml")))
assert kust["kind"] == "Kustomization", kust
for key in ("patches", "patchesStrategicMerge", "configMapGenerator", "secretGenerator", "images"):
    # kubectl would change the files on the way: CI validates them as written.
    assert key not in kust, f"kustomization.yaml: {key} makes what is applied differ from the files"
workloads = []
for res in kust["resources"]:
    for doc in yaml.safe_load_all(open(os.path.join(d, res))):
        kubernetes_validate.validate(doc, "1.33", strict=True)
        kind, name = doc["kind"], doc["metadata"]["name"]
        spec = doc.get("spec", {})
        pod = spec.get("template", {}).get("spec")
        item = {"file": res, "kind": kind, "name": name, "replicas": spec.get("replicas")}
        if kind == "Service":
            item["ports"] = [p["port"] for p in spec["ports"]]
            item["headless"] = spec.get("clusterIP") == "None"
            item["selector"] = spec.get("selector")
        if pod:
            item["labels"] = doc["spec"]["template"]["metadata"]["labels"]
            item["pod_security"] = pod.get("securityContext", {})
            item["annotations"] = doc["spec"]["template"]["metadata"].get("annotations", {})
            item["containers"] = []
            for c in pod["containers"]:
                probes = {}
                for p in ("startupProbe", "readinessProbe", "livenessProbe"):
                    if "httpGet" in c.get(p, {}):
                        probes[p] = c[p]["httpGet"]["path"]
                item["containers"].append({
                    "name": c["name"],
                    "image": c["image"],
                    "args": c.get("args", []),
                    "env": [e["name"] for e in c.get("env", [])],
                    "ports": [p["containerPort"] for p in c.get("ports", [])],
                    "probes": probes,
                    "gpus": c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu"),
                    "security": c.get("securityContext", {}),
                })
        workloads.append(item)
print(json.dumps(workloads))
