#!/usr/bin/python3
"""Validates Kubernetes manifests offline, against the API schema of Debian's python3-kubernetes.

    /usr/bin/python3 tests/k8s/validate_manifests.py deploy/k8s/*.yaml

No cluster and no network: every YAML document is checked against the typed model the official
Python client has for its apiVersion and kind (kubernetes.client.V1Deployment, ...), and then
against what a reviewer of Conveyor's manifests would check by hand. Exit status: 0 all valid,
1 something is wrong (each finding on a line of its own, starting with ERROR, naming the file,
the document's index in it and the field's dotted path), 2 the validator could not run.

Schema (every document):
  - unknown apiVersion or kind: the client has no API group/version or no create method for it;
  - unknown fields, at any depth: each key must be in its model's attribute_map (the client's
    deserializer silently drops unknown keys, and so does a non-strict API server, so a
    misspelled field would otherwise vanish without a word);
  - missing required fields (those whose model setter refuses None), metadata.name;
  - wrong types: strings, integers, booleans, lists and maps where the schema has them
    (`value: 4` for an env var, `runAsNonRoot: "true"`); quantities (cpu, memory) must parse;
    int-or-string fields (ports, maxUnavailable) must be one of the two;
  - duplicate keys in a mapping (YAML keeps the last one silently);
  - then the document is deserialized with ApiClient().deserialize into the typed model, with
    the client's own validation on.
  The client's schema is that of its Kubernetes release (python3-kubernetes 22.6 = Kubernetes
  1.22). Fields added to the API later are in OVERLAY below, each with the release that added
  it; the summary names the ones a document used.

Semantics (what kubectl would accept but would not work as meant):
  - every container has resources.requests and resources.limits for cpu and memory, with
    requests <= limits;
  - a container that runs `conveyor serve`: listens beyond loopback; declares its --listen
    (and --metrics-listen) port as a containerPort; has a readinessProbe that is a native gRPC
    probe (grpc.health.v1, which conveyor serve answers unauthenticated) on its --listen port
    and a livenessProbe; its --grace-seconds is below the pod's terminationGracePeriodSeconds;
    a bearer token (--auth-token-file) goes with TLS (--tls-cert), as conveyor serve demands
    beyond loopback unless --insecure-plaintext-token;
  - volumeMounts name volumes of the pod; probes' named ports are container ports; a file a
    command reads from a ConfigMap or Secret volume is a key that volume has;
  - a workload's selector matches its pod template's labels; a Service's or a
    PodDisruptionBudget's selector matches a pod template in the files given; a Service's
    targetPort names (or numbers) a port of the containers it selects;
  - a ConfigMap's *.yaml / *.yml / *.json keys parse;
  - CONVEYOR_SERVERS=dns:///NAME...:PORT names a port of Service NAME when that Service is in
    the files given.
Cross-document checks look at every file on the command line together.
"""

import argparse
import difflib
import inspect
import json
import os
import re
import sys

try:
    import yaml
    import kubernetes
    from kubernetes import client as k8s
    from kubernetes.utils.quantity import parse_quantity
except ImportError as e:  # pragma: no cover
    print(f"validate_manifests: {e}: needs Debian's python3-kubernetes "
          "(apt-get install python3-kubernetes; tools/setup.sh installs it)", file=sys.stderr)
    sys.exit(2)

# Fields of the Kubernetes API newer than the packaged client's schema: model -> json field ->
# (type, first release). Applied only where the installed client lacks the field.
OVERLAY_FIELDS = {
    # Native gRPC probes (KEP-2727): alpha 1.23, beta and on by default 1.24, GA 1.27.
    "V1Probe": {"grpc": ("V1GRPCAction", "1.24")},
}
OVERLAY_MODELS = {
    # core/v1 GRPCAction: port is required (a number: named ports are not allowed here).
    "V1GRPCAction": {"fields": {"port": "int", "service": "str"}, "required": {"port"}},
}

# Fields the client types as str or dict(str, str) that the API parses as resource.Quantity
# (numbers are accepted there: `cpu: 2`).
QUANTITY_FIELDS = {
    ("V1ResourceRequirements", "limits"), ("V1ResourceRequirements", "requests"),
    ("V1EmptyDirVolumeSource", "size_limit"), ("V1ResourceFieldSelector", "divisor"),
    ("V1LimitRangeItem", "default"), ("V1LimitRangeItem", "default_request"),
    ("V1LimitRangeItem", "max"), ("V1LimitRangeItem", "min"),
    ("V1LimitRangeItem", "max_limit_request_ratio"), ("V1ResourceQuotaSpec", "hard"),
    ("V1PersistentVolumeSpec", "capacity"), ("V1PodSpec", "overhead"),
}
# Fields the client types as `object` that are IntOrString in the API.
INT_OR_STRING_ATTRS = {"port", "target_port", "max_unavailable", "max_surge", "min_available"}

WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job",
                  "ReplicationController"}
LOOPBACK = re.compile(r"^(127\.\d+\.\d+\.\d+|localhost|\[?::1\]?)$")
CONVEYOR_SERVE_DEFAULTS = {"--listen": "127.0.0.1:7700", "--grace-seconds": "10"}  # tools/commands.h


class Findings:
    def __init__(self):
        self.errors = []

    def error(self, where, path, msg):
        self.errors.append(f"ERROR {where}: {path}: {msg}" if path else f"ERROR {where}: {msg}")


def fmt_path(parent, key):
    if isinstance(key, int):
        return f"{parent}[{key}]"
    if re.fullmatch(r"[A-Za-z_$][A-Za-z0-9_$-]*", str(key)):
        return f"{parent}.{key}" if parent else str(key)
    return f"{parent}[{json.dumps(key)}]"


# ---------------------------------------------------------------- YAML with duplicate-key errors
class StrictLoader(yaml.SafeLoader):
    pass


def _construct_mapping(loader, node, deep=False):
    seen = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark,
                f"duplicate key {key!r} (first on line {seen[key] + 1})", key_node.start_mark)
        seen[key] = key_node.start_mark.line
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


# ---------------------------------------------------------------- the client's schema
_fields_cache = {}


def model_fields(name):
    """json field -> (python attribute, type string), required json fields, overlay fields used."""
    if name in _fields_cache:
        return _fields_cache[name]
    if name in OVERLAY_MODELS:
        m = OVERLAY_MODELS[name]
        result = ({k: (k, t) for k, t in m["fields"].items()}, set(m["required"]), {})
    else:
        cls = getattr(k8s, name)
        fields = {cls.attribute_map[a]: (a, t) for a, t in cls.openapi_types.items()}
        required = set()
        for attr, _ in cls.openapi_types.items():
            setter = getattr(cls, attr).fset
            if setter and "must not be `None`" in inspect.getsource(setter):
                required.add(cls.attribute_map[attr])
        overlay = {}
        for key, (typ, release) in OVERLAY_FIELDS.get(name, {}).items():
            if key not in fields:
                fields[key] = (key, typ)
                overlay[key] = release
        result = (fields, required, overlay)
    _fields_cache[name] = result
    return result


def is_model(typ):
    return typ in OVERLAY_MODELS or (re.fullmatch(r"V\d\w*|\w+V\d\w*", typ) is not None
                                     and hasattr(k8s, typ))


TYPE_WORDS = {"str": "a string", "int": "an integer", "float": "a number", "bool": "a boolean",
              "datetime": "a timestamp string", "date": "a date string"}


def describe(typ):
    if typ.startswith("list["):
        return "a list"
    if typ.startswith("dict("):
        return "a map"
    if is_model(typ):
        return f"a mapping ({typ})"
    return TYPE_WORDS.get(typ, typ)


def type_name(v):
    return {str: "string", bool: "boolean", int: "integer", float: "number", list: "list",
            dict: "mapping"}.get(type(v), type(v).__name__)


class SchemaChecker:
    def __init__(self, findings, where):
        self.f = findings
        self.where = where
        self.fields_checked = 0
        self.overlay_used = set()

    def err(self, path, msg):
        self.f.error(self.where, path, msg)

    def check(self, value, typ, path, owner=None):
        """owner: (model name, attribute) whose declared type typ is, for quantity/IntOrString."""
        if value is None:  # null: unset, as in the API
            return
        m = re.fullmatch(r"list\[(.+)\]", typ)
        if m:
            if not isinstance(value, list):
                return self.err(path, f"expected a list, got {type_name(value)} {value!r}")
            for i, v in enumerate(value):
                self.check(v, m.group(1), fmt_path(path, i), owner)
            return
        m = re.fullmatch(r"dict\(str, (.+)\)", typ)
        if m:
            if not isinstance(value, dict):
                return self.err(path, f"expected a map, got {type_name(value)} {value!r}")
            for k, v in value.items():
                if not isinstance(k, str):
                    self.err(fmt_path(path, str(k)), f"map keys must be strings, got {type_name(k)} {k!r}")
                self.check(v, m.group(1), fmt_path(path, str(k)), owner)
            return
        if is_model(typ):
            return self.check_model(value, typ, path)
        self.fields_checked += 1
        if owner in QUANTITY_FIELDS:
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                return self.err(path, f"expected a quantity, got {type_name(value)} {value!r}")
            try:
                parse_quantity(value)
            except (ValueError, ArithmeticError):
                self.err(path, f"not a Kubernetes quantity: {value!r} (e.g. 500m, 2, 1.5Gi, 512Mi)")
            return
        if typ == "object":
            if owner and owner[1] in INT_OR_STRING_ATTRS and (
                    isinstance(value, bool) or not isinstance(value, (int, str))):
                self.err(path, f"expected an integer or a string, got {type_name(value)} {value!r}")
            return
        ok = {"str": lambda v: isinstance(v, str),
              "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
              "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
              "bool": lambda v: isinstance(v, bool),
              "datetime": lambda v: isinstance(v, str) or hasattr(v, "isoformat"),
              "date": lambda v: isinstance(v, str) or hasattr(v, "isoformat")}.get(typ)
        if ok is None:
            return self.err(path, f"validator has no rule for schema type {typ!r}")
        if not ok(value):
            hint = " (quote it)" if typ == "str" and isinstance(value, (int, float, bool)) else ""
            self.err(path, f"expected {describe(typ)}, got {type_name(value)} {value!r}{hint}")

    def check_model(self, value, name, path):
        if not isinstance(value, dict):
            return self.err(path, f"expected {describe(name)}, got {type_name(value)} {value!r}")
        fields, required, overlay = model_fields(name)
        for key, v in value.items():
            p = fmt_path(path, str(key))
            if key not in fields:
                close = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.75)
                hint = f"; did you mean {close[0]!r}?" if close else \
                    f"; {name} has: {', '.join(sorted(fields))}"
                self.err(p, f"unknown field {key!r} (not in the schema of {name}{hint})")
                continue
            attr, typ = fields[key]
            if key in overlay:
                self.overlay_used.add(f"{name}.{key} (Kubernetes {overlay[key]}+)")
            self.check(v, typ, p, (name, attr))
        for key in sorted(required):
            if value.get(key) is None:
                self.err(fmt_path(path, key), f"missing required field ({name})")


class _Response:
    def __init__(self, doc):
        self.data = json.dumps(doc, default=str)


def resolve_kind(api_version, kind):
    """-> (model name, None) or (None, why). Same mapping as kubernetes.utils.create_from_yaml."""
    group, _, version = api_version.partition("/")
    if not version:
        group, version = "core", group
    group = "".join(group.rsplit(".k8s.io", 1))
    api_name = "".join(w.capitalize() for w in group.split(".")) + version.capitalize() + "Api"
    api = getattr(k8s, api_name, None)
    if api is None:
        return None, f"unknown apiVersion {api_version!r} (the client has no {api_name})"
    snake = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", re.sub(r"(.)([A-Z][a-z]+)", r"\1_\2", kind)).lower()
    for method in (f"create_namespaced_{snake}", f"create_{snake}"):
        fn = getattr(api, method, None)
        if fn is not None:
            m = re.search(r":return: (\w+)", fn.__doc__ or "")
            if m and hasattr(k8s, m.group(1)):
                return m.group(1), None
    return None, f"unknown kind {kind!r} in {api_version} (the client's {api_name} cannot create it)"


# ---------------------------------------------------------------- semantic checks
def d(v):
    return v if isinstance(v, dict) else {}


def lst(v):
    return v if isinstance(v, list) else []


class Doc:
    def __init__(self, file, index, raw):
        self.file, self.index, self.raw = file, index, raw
        self.kind = raw.get("kind") if isinstance(raw, dict) else None
        meta = d(d(raw).get("metadata"))
        self.name = meta.get("name") or meta.get("generateName") or "?"
        self.namespace = meta.get("namespace")
        self.where = f"{file}[{index}] {self.kind or '?'}/{self.name}"
        self.schema_ok = False

    def pod_templates(self):
        """(path of the pod spec, labels, pod spec) of each pod this document makes."""
        spec = d(self.raw.get("spec"))
        if self.kind == "Pod":
            return [("spec", d(d(self.raw.get("metadata")).get("labels")), spec)]
        if self.kind in WORKLOAD_KINDS:
            t = d(spec.get("template"))
            return [("spec.template.spec", d(d(t.get("metadata")).get("labels")), d(t.get("spec")))]
        if self.kind == "CronJob":
            t = d(d(d(spec.get("jobTemplate")).get("spec")).get("template"))
            return [("spec.jobTemplate.spec.template.spec", d(d(t.get("metadata")).get("labels")),
                     d(t.get("spec")))]
        return []


def selector_matches(sel, labels):
    """sel: a LabelSelector ({matchLabels, matchExpressions}) or a plain map (Service)."""
    sel = d(sel)
    if "matchLabels" in sel or "matchExpressions" in sel:
        match_labels = d(sel.get("matchLabels"))
        exprs = lst(sel.get("matchExpressions"))
    else:
        match_labels, exprs = sel, []
    if not match_labels and not exprs:
        return False
    if any(labels.get(k) != v for k, v in match_labels.items()):
        return False
    for e in map(d, exprs):
        key, op, values = e.get("key"), e.get("operator"), lst(e.get("values"))
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def conveyor_serve_args(container):
    """The arguments after `conveyor serve` as {flag: value}, or None if it runs something else."""
    argv = [str(a) for a in lst(container.get("command")) + lst(container.get("args"))]
    for i in range(len(argv) - 1):
        if os.path.basename(argv[i]) == "conveyor" and argv[i + 1] == "serve":
            flags = dict(CONVEYOR_SERVE_DEFAULTS)
            rest = argv[i + 2:]
            j = 0
            while j < len(rest):
                a = rest[j]
                if a.startswith("--") and "=" in a:
                    k, v = a.split("=", 1)
                    flags[k] = v
                elif a.startswith("--") and j + 1 < len(rest):
                    flags[a] = rest[j + 1]
                    j += 1
                j += 1
            return flags
    return None


def split_host_port(addr):
    host, _, port = addr.rpartition(":")
    return host, int(port) if port.isdigit() else None


def check_containers(doc, f, spec_path, labels, pod, configmaps):
    volumes = {v.get("name"): v for v in map(d, lst(pod.get("volumes")))}
    grace_period = pod.get("terminationGracePeriodSeconds", 30)
    for group in ("initContainers", "containers"):
        for ci, c in enumerate(map(d, lst(pod.get(group)))):
            cpath = f"{spec_path}.{group}[{ci}]"
            cname = f" (container {c.get('name')})" if c.get("name") else ""
            res = d(c.get("resources"))
            for section in ("requests", "limits"):
                for r in ("cpu", "memory"):
                    if d(res.get(section)).get(r) is None:
                        f.error(doc.where, f"{cpath}.resources.{section}.{r}",
                                f"missing{cname}: every container needs requests and limits for "
                                "cpu and memory")
            for r in ("cpu", "memory"):
                req, lim = d(res.get("requests")).get(r), d(res.get("limits")).get(r)
                try:
                    if req is not None and lim is not None and parse_quantity(req) > parse_quantity(lim):
                        f.error(doc.where, f"{cpath}.resources.requests.{r}",
                                f"request {req} is above the limit {lim}{cname}")
                except (ValueError, ArithmeticError):
                    pass  # reported by the schema check
            port_names = {p.get("name") for p in map(d, lst(c.get("ports"))) if p.get("name")}
            port_numbers = {p.get("containerPort") for p in map(d, lst(c.get("ports")))}
            for mi, vm in enumerate(map(d, lst(c.get("volumeMounts")))):
                if vm.get("name") not in volumes:
                    f.error(doc.where, f"{cpath}.volumeMounts[{mi}].name",
                            f"no volume {vm.get('name')!r} in {spec_path}.volumes{cname}")
            for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
                probe = d(c.get(probe_name))
                for handler in ("httpGet", "tcpSocket"):
                    port = d(probe.get(handler)).get("port")
                    if isinstance(port, str) and port not in port_names:
                        f.error(doc.where, f"{cpath}.{probe_name}.{handler}.port",
                                f"names no port of the container{cname} (ports: {sorted(port_names)})")
            check_mounted_files(doc, f, cpath, cname, c, volumes, configmaps)
            serve = conveyor_serve_args(c)
            if serve is None:
                continue
            host, port = split_host_port(serve["--listen"])
            if LOOPBACK.match(host):
                f.error(doc.where, f"{cpath}.command",
                        f"conveyor serve listens on {serve['--listen']} (loopback){cname}: the "
                        "kubelet's probes and the Service reach the pod's IP; use --listen 0.0.0.0:PORT")
            if port is not None and port not in port_numbers:
                f.error(doc.where, f"{cpath}.ports",
                        f"conveyor serve's --listen port {port} is not a containerPort{cname}")
            argv = [str(a) for a in lst(c.get("command")) + lst(c.get("args"))]
            if ("--auth-token-file" in serve and "--tls-cert" not in serve
                    and "--insecure-plaintext-token" not in argv):
                f.error(doc.where, f"{cpath}.command",
                        f"conveyor serve takes a bearer token without TLS{cname}: the token would cross "
                        "the network in cleartext, and conveyor serve refuses to start; add --tls-cert "
                        "and --tls-key (a Secret of type kubernetes.io/tls)")
            if "--metrics-listen" in serve:
                _, mport = split_host_port(serve["--metrics-listen"])
                if mport is not None and mport not in port_numbers:
                    f.error(doc.where, f"{cpath}.ports",
                            f"conveyor serve's --metrics-listen port {mport} is not a containerPort{cname}")
            readiness = d(c.get("readinessProbe"))
            if not readiness:
                f.error(doc.where, f"{cpath}.readinessProbe",
                        f"missing{cname}: a conveyor server needs a readinessProbe (grpc: {{port: {port}}}), "
                        "so that the Service lists it only while it serves and drops it when it drains")
            elif "grpc" not in readiness:
                f.error(doc.where, f"{cpath}.readinessProbe",
                        f"not a native gRPC probe{cname}: use grpc: {{port: {port}}} "
                        "(grpc.health.v1, which conveyor serve answers without the token)")
            if not c.get("livenessProbe"):
                f.error(doc.where, f"{cpath}.livenessProbe", f"missing{cname}: a conveyor server needs a livenessProbe")
            for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
                g = d(d(c.get(probe_name)).get("grpc"))
                if not g:
                    continue
                if g.get("port") is not None and g.get("port") != port:
                    f.error(doc.where, f"{cpath}.{probe_name}.grpc.port",
                            f"{g.get('port')!r} is not conveyor serve's --listen port {port}{cname}")
                if g.get("service") not in (None, "", "conveyor.v1.Conveyor"):
                    f.error(doc.where, f"{cpath}.{probe_name}.grpc.service",
                            f"conveyor serve reports health for '' and 'conveyor.v1.Conveyor' only, "
                            f"not {g.get('service')!r}")
            try:
                grace = float(serve["--grace-seconds"])
            except ValueError:
                grace = None
            if grace is not None and isinstance(grace_period, int) and grace >= grace_period:
                f.error(doc.where, f"{spec_path}.terminationGracePeriodSeconds",
                        f"{grace_period} is not above conveyor serve's --grace-seconds {serve['--grace-seconds']}"
                        f"{cname}: the kubelet would SIGKILL the server before its drain ends")


def check_mounted_files(doc, f, cpath, cname, c, volumes, configmaps):
    """A path in the command or args under a ConfigMap or Secret volume's mount is a key it has."""
    argv = [a for a in lst(c.get("command")) + lst(c.get("args")) if isinstance(a, str)]
    for vm in map(d, lst(c.get("volumeMounts"))):
        vol, mount = d(volumes.get(vm.get("name"))), vm.get("mountPath")
        if not isinstance(mount, str) or vm.get("subPath"):
            continue
        if "configMap" in vol:
            source = d(vol["configMap"])
            cm = configmaps.get((doc.namespace, source.get("name")))
            keys = set(d(d(cm).get("data"))) | set(d(d(cm).get("binaryData"))) if cm else None
            what = f"ConfigMap {source.get('name')}"
        elif "secret" in vol:
            source = d(vol["secret"])
            keys, what = None, f"Secret {source.get('secretName')}"
        else:
            continue
        items = lst(source.get("items"))
        if items:  # only the listed keys appear, at their paths
            keys = {d(i).get("path") for i in items}
        if keys is None:
            continue
        for a in argv:
            if a.startswith(mount.rstrip("/") + "/"):
                rel = a[len(mount.rstrip("/")) + 1:]
                if rel not in keys:
                    f.error(doc.where, f"{cpath}.command",
                            f"reads {a}, but the {what} mounted at {mount} has no key {rel!r} "
                            f"(keys: {sorted(keys)}){cname}")


def check_semantics(docs, f):
    configmaps = {(x.namespace, x.name): x.raw for x in docs if x.kind == "ConfigMap"}
    templates = [(x, path, labels, pod) for x in docs for path, labels, pod in x.pod_templates()]
    services = {(x.namespace, x.name): x for x in docs if x.kind == "Service"}
    files = sorted({x.file for x in docs})
    for x in docs:
        raw, spec = x.raw, d(x.raw.get("spec"))
        for path, labels, pod in x.pod_templates():
            check_containers(x, f, path, labels, pod, configmaps)
        if x.kind in WORKLOAD_KINDS and x.kind != "Job" or (x.kind == "Job" and spec.get("selector")):
            labels = d(d(d(spec.get("template")).get("metadata")).get("labels"))
            if not selector_matches(spec.get("selector"), labels):
                f.error(x.where, "spec.selector",
                        f"{json.dumps(spec.get('selector'))} does not match the pod template's labels "
                        f"{json.dumps(labels)}")
        if x.kind in ("Service", "PodDisruptionBudget") and spec.get("selector"):
            matched = [(t, p, pod) for t, p, labels, pod in templates
                       if t.namespace == x.namespace and selector_matches(spec["selector"], labels)]
            if not matched:
                f.error(x.where, "spec.selector",
                        f"{json.dumps(spec['selector'])} matches no pod template in {', '.join(files)}")
            if x.kind == "Service":
                for pi, p in enumerate(map(d, lst(spec.get("ports")))):
                    target = p.get("targetPort", p.get("port"))
                    for t, tpath, pod in matched:
                        ports = [d(q) for c in map(d, lst(pod.get("containers"))) for q in lst(c.get("ports"))]
                        key = "name" if isinstance(target, str) else "containerPort"
                        if not any(q.get(key) == target for q in ports):
                            f.error(x.where, f"spec.ports[{pi}].targetPort",
                                    f"{target!r} is no container port of {t.kind}/{t.name} "
                                    f"(ports: {[q.get('name') or q.get('containerPort') for q in ports]})")
        if x.kind == "ConfigMap":
            for key, text in d(raw.get("data")).items():
                if not isinstance(text, str):
                    continue
                try:
                    if key.endswith((".yaml", ".yml")):
                        list(yaml.load_all(text, Loader=StrictLoader))
                    elif key.endswith(".json"):
                        json.loads(text)
                except (yaml.YAMLError, ValueError) as e:
                    f.error(x.where, fmt_path("data", key), "does not parse: " + " ".join(str(e).split()))
        for path, labels, pod in x.pod_templates():
            for group in ("initContainers", "containers"):
                for ci, c in enumerate(map(d, lst(pod.get(group)))):
                    for ei, e in enumerate(map(d, lst(c.get("env")))):
                        if e.get("name") != "CONVEYOR_SERVERS" or not isinstance(e.get("value"), str):
                            continue
                        for entry in e["value"].split(","):
                            m = re.fullmatch(r"dns:///([^.:/]+)[^:/]*:(\d+)", entry.strip())
                            if not m:
                                continue
                            svc = next((s for s in services.values() if s.name == m.group(1)), None)
                            if svc is None:
                                continue  # not among the files given
                            sports = [d(p).get("port") for p in lst(d(svc.raw.get("spec")).get("ports"))]
                            if int(m.group(2)) not in sports:
                                f.error(x.where, f"{path}.{group}[{ci}].env[{ei}].value",
                                        f"port {m.group(2)} is not a port of Service {svc.name} (ports: {sports})")


# ---------------------------------------------------------------- main
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="manifest files (YAML, several documents each)")
    args = ap.parse_args(argv)
    f = Findings()
    docs = []
    for path in args.files:
        try:
            with open(path) as fh:
                loaded = list(yaml.load_all(fh, Loader=StrictLoader))
        except OSError as e:
            print(f"validate_manifests: {e}", file=sys.stderr)
            return 2
        except yaml.YAMLError as e:
            f.error(path, None, "YAML: " + " ".join(str(e).split()))
            continue
        for i, raw in enumerate(loaded):
            if raw is None:
                continue
            doc = Doc(path, i, raw)
            if not isinstance(raw, dict):
                f.error(doc.where, None, f"a document must be a mapping, got {type_name(raw)}")
                continue
            docs.append(doc)

    api_client = k8s.ApiClient()
    summaries = []
    for doc in docs:
        before = len(f.errors)
        raw = doc.raw
        for key in ("apiVersion", "kind"):
            if not isinstance(raw.get(key), str):
                f.error(doc.where, key, "missing (a string)")
        if len(f.errors) > before:
            continue
        model, why = resolve_kind(raw["apiVersion"], raw["kind"])
        if model is None:
            f.error(doc.where, "kind", why)
            continue
        checker = SchemaChecker(f, doc.where)
        checker.check_model(raw, model, "")
        if not d(raw.get("metadata")).get("name") and not d(raw.get("metadata")).get("generateName"):
            f.error(doc.where, "metadata.name", "missing required field")
        if len(f.errors) == before:  # the client's own deserializer and validation, as a cross-check
            try:
                obj = api_client.deserialize(_Response(raw), model)
                assert type(obj).__name__ == model
            except (ValueError, TypeError, AssertionError) as e:
                f.error(doc.where, None, f"the client's deserializer refused it as {model}: {e}")
        doc.schema_ok = len(f.errors) == before
        extra = f"; fields newer than the client: {', '.join(sorted(checker.overlay_used))}" \
            if checker.overlay_used else ""
        summaries.append((doc, f"{raw['apiVersion']} {raw['kind']} {doc.name}: schema "
                               f"{'ok' if doc.schema_ok else 'FAILED'} ({model}, "
                               f"{checker.fields_checked} values checked{extra})"))
    schema_errors = len(f.errors)
    check_semantics(docs, f)

    print(f"validate_manifests: python3-kubernetes {kubernetes.__version__} "
          f"(the Kubernetes 1.{kubernetes.__version__.split('.')[0]} API), "
          f"{len(docs)} documents in {len(args.files)} files")
    for doc, line in summaries:
        own = [e for e in f.errors if e.startswith(f"ERROR {doc.where}:")]
        print(f"  {doc.file}[{doc.index}] {line}; findings: {len(own)}")
    for e in f.errors:
        print(e)
    if f.errors:
        print(f"validate_manifests: FAILED: {len(f.errors)} findings "
              f"({schema_errors} schema, {len(f.errors) - schema_errors} semantic)")
        return 1
    print("validate_manifests: all documents valid")
    return 0


if __name__ == "__main__":
    sys.exit(main())
