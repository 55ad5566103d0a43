#!/usr/bin/python3
"""`kubectl apply --dry-run=client` on every manifest of deploy/k8s, with no cluster.

kubectl's client-side dry run still asks an API server two things: discovery (which resource serves
a kind) and the object's current state (to choose create or patch). This test answers both from a
stand-in on 127.0.0.1: discovery for the kinds Conveyor's manifests use (ConfigMap, Service,
Secret, Deployment, Job, PodDisruptionBudget; each with the verbs and scope of the real API) and
NotFound for every object, which is what an empty namespace answers. It records every request:
a dry run must send nothing but GETs. Schema checks are validate_manifests.py's job (offline,
against the API's typed models): kubectl runs with --validate=false because its own validation
downloads the server's OpenAPI document.

    /usr/bin/python3 tests/k8s/kubectl_dry_run_test.py deploy/k8s/*.yaml

Exit status: 0 when kubectl printed "<kind>/<name> created (dry run)" (or "configured") for every
document and sent only GETs; 77 (skipped) without kubectl (Debian: kubernetes-client).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import yaml

VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]
# groupVersion -> [(resource, kind, namespaced)]
RESOURCES = {
    "v1": [("configmaps", "ConfigMap", True), ("services", "Service", True),
           ("secrets", "Secret", True), ("pods", "Pod", True),
           ("persistentvolumeclaims", "PersistentVolumeClaim", True),
           ("namespaces", "Namespace", False)],
    "apps/v1": [("deployments", "Deployment", True), ("statefulsets", "StatefulSet", True),
                ("daemonsets", "DaemonSet", True)],
    "batch/v1": [("jobs", "Job", True), ("cronjobs", "CronJob", True)],
    "policy/v1": [("poddisruptionbudgets", "PodDisruptionBudget", True)],
}


def resource_list(group_version):
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version,
            "resources": [{"name": r, "singularName": k.lower(), "namespaced": ns, "kind": k,
                           "verbs": VERBS} for r, k, ns in RESOURCES[group_version]]}


def group_list():
    groups = []
    for gv in RESOURCES:
        if "/" not in gv:
            continue
        group, version = gv.split("/")
        entry = {"groupVersion": gv, "version": version}
        groups.append({"name": group, "versions": [entry], "preferredVersion": entry})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


class FakeApi(BaseHTTPRequestHandler):
    requests = []  # (method, path)

    def log_message(self, *args):
        pass

    def reply(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        FakeApi.requests.append(("GET", self.path))
        path = self.path.split("?")[0].rstrip("/")
        if path == "/version":
            return self.reply(200, {"major": "1", "minor": "29", "gitVersion": "v1.29.0"})
        if path == "/api":
            return self.reply(200, {"kind": "APIVersions", "versions": ["v1"],
                                    "serverAddressByClientCIDRs": [
                                        {"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]})
        if path == "/apis":
            return self.reply(200, group_list())
        if path == "/api/v1":
            return self.reply(200, resource_list("v1"))
        if path.startswith("/apis/") and path[len("/apis/"):] in RESOURCES:
            return self.reply(200, resource_list(path[len("/apis/"):]))
        # Any object: an empty namespace has none.
        self.reply(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                         "reason": "NotFound", "message": f"{path} not found", "code": 404})

    def refuse(self):
        FakeApi.requests.append((self.command, self.path))
        self.reply(405, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                         "message": "a client-side dry run must not write", "code": 405})

    do_POST = do_PUT = do_PATCH = do_DELETE = refuse


def main(files):
    kubectl = shutil.which("kubectl")
    if not kubectl:
        print("SKIP: no kubectl (apt-get install kubernetes-client)")
        return 77
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = os.path.join(tmp, "kubeconfig")
        with open(kubeconfig, "w") as f:
            yaml.safe_dump({
                "apiVersion": "v1", "kind": "Config", "current-context": "stand-in",
                "clusters": [{"name": "stand-in", "cluster": {
                    "server": f"http://127.0.0.1:{server.server_address[1]}"}}],
                "contexts": [{"name": "stand-in",
                              "context": {"cluster": "stand-in", "namespace": "default"}}],
                "users": [{"name": "none", "user": {}}]}, f)
        env = dict(os.environ, KUBECONFIG=kubeconfig, HOME=tmp)
        version = subprocess.run([kubectl, "version", "--client"], capture_output=True, text=True,
                                 env=env).stdout.splitlines()[:1]
        print(f"kubectl: {kubectl} {' '.join(version)}; API stand-in on {server.server_address}")
        for path in files:
            with open(path) as f:
                docs = [d for d in yaml.safe_load_all(f) if d]
            expected = {f"{d['kind'].lower()}/{d['metadata']['name']}" for d in docs}
            run = subprocess.run([kubectl, "apply", "--dry-run=client", "--validate=false",
                                  "-f", path], capture_output=True, text=True, env=env, timeout=60)
            print(f"$ kubectl apply --dry-run=client --validate=false -f {path}\n{run.stdout}"
                  f"{run.stderr}", end="")
            done = set()
            for line in run.stdout.splitlines():
                words = line.split()
                if len(words) >= 2 and words[1] in ("created", "configured", "unchanged"):
                    # "deployment.apps/conveyor" -> "deployment/conveyor"
                    kind, _, name = words[0].partition("/")
                    done.add(f"{kind.split('.')[0]}/{name}")
            if run.returncode != 0:
                failures.append(f"{path}: kubectl exited {run.returncode}")
            if done != expected:
                failures.append(f"{path}: applied {sorted(done)}, expected {sorted(expected)}")
    server.shutdown()
    writes = [r for r in FakeApi.requests if r[0] != "GET"]
    if writes:
        failures.append(f"the dry run sent writes: {writes}")
    for f in failures:
        print(f"FAIL: {f}")
    print(f"{len(files) - len({f.split(':')[0] for f in failures})} passed, "
          f"{len({f.split(':')[0] for f in failures})} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
