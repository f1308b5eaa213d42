"""Kubernetes objects of a deployment (plain dicts, validated by `pipeline.ops.deploy.validate` before anything is written).

Serving: one node -> Deployment; several -> LeaderWorkerSet (`leaderworkerset.x-k8s.io/v1`, group size = nodes,
`RecreateGroupOnPodRestart`), whose leader mpiruns every rank over the group's pods (kubectl exec: a Role for
pods/exec). Both get a Service on the runtime's ports (engine: HTTP 8000, gRPC 8001, metrics 8002; pytorch: the
OpenAI HTTP port 8000), a ConfigMap with the scripts, GPU limits,
/dev/shm, probes on the runtime's health endpoints (the engine runtime's readiness probe runs `ready.sh`: Triton's
ready endpoint plus its Python stubs alive, see `pipeline.ops.deploy.stub_watch`) and an init container that fetches and verifies the release on
the node. The node-local WORK volume is an emptyDir with a `sizeLimit`, and the containers that use it request and
limit the same `ephemeral-storage`, sized from the plan's release bytes (`work_bytes`), so the scheduler places the
pod on a node with that much disk instead of the kubelet evicting it mid-unpack. The one-node Deployment uses the
`Recreate` strategy: its GPUs are released before the new pod asks for them. Build matrix: an Indexed Job, one index
per cell, HF token from a Secret. GPU pods tolerate the GPU taint, require the spec's GPU product and take the
user's nodeSelector; serving containers request host CPU and memory and any RDMA resources, with NCCL's environment
(`pipeline.ops.deploy.scheduling`).

Names are checked as the API server and the container runtime would (`pipeline.ops.deploy.names`), each error naming
its flag.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ValidationInfo, field_validator

from pipeline.core.gpus import GIB
from pipeline.core.spec import BuildSpec
from pipeline.ops.deploy import names, scheduling
from pipeline.ops.deploy.runtime import CONFIG, HTTP_PORT, WORK, Runtime
from pipeline.planning.placement import Placement
from pipeline.stages.resources import plan_resources

LWS_API = "leaderworkerset.x-k8s.io/v1"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
GPU = "nvidia.com/gpu"
SCRIPT_MODE = 0o755
EPHEMERAL = "ephemeral-storage"
# WORK beyond the release: the kubectl copy, the serving inputs, container logs and writable layers, and the
# estimate's error (the release bytes are the plan's figure, not a measurement of the tarball).
WORK_MARGIN = 0.05
WORK_HEADROOM = 2 * GIB
# The flag each user-set name comes from (errors name it).
FLAGS = {"namespace": "--namespace", "release_pvc": "--release-volume", "output_pvc": "--matrix-output",
         "hf_secret": "hf_secret", "release_secret": "--release-secret", "server_image": "--image", "pipeline_image": "--pipeline-image"}


class K8sOptions(BaseModel):
    name: str
    namespace: str = "default"
    server_image: str
    pipeline_image: str
    pipeline_cmd: str
    release_file: str
    release_url: str | None = None
    release_secret: str | None = None  # a Secret whose key `header` the fetch sends with release_url
    release_pvc: str | None = None
    sha256: str | None = None
    hf_secret: str = "hf-token"
    output_pvc: str = "trtllm-build-output"
    work_bytes: int | None = None  # WORK's size on a serving node (`work_bytes()`; required by serving pods)
    replicas: int = 1  # serving copies: the Deployment's pods, the LeaderWorkerSet's groups
    node_selector: dict[str, str] = {}
    tolerations: list[dict[str, str]] = []  # GPU pods: scheduling.tolerations()
    gpu_products: tuple[str, ...] = ()  # GPU pods require one of them (nvidia.com/gpu.product); () no affinity
    cpus: int | None = None  # CPU request (serving: scheduling.host_cpus; build matrix: platforms.matrix_cpus)
    memory_bytes: int | None = None  # memory request (serving: scheduling.host_memory_bytes; matrix: matrix_mem_bytes)
    extra_resources: dict[str, str] = {}  # serving containers: e.g. {"rdma/rdma_shared_device_a": "1"}
    nccl_env: dict[str, str] = {}  # serving containers' NCCL_* environment

    @field_validator("namespace")
    @classmethod
    def _label(cls, v: str, info: ValidationInfo) -> str:
        return names.dns1123_label(v, FLAGS[str(info.field_name)])

    @field_validator("release_pvc", "output_pvc", "hf_secret", "release_secret")
    @classmethod
    def _subdomain(cls, v: str | None, info: ValidationInfo) -> str | None:
        return v if v is None else names.dns1123_subdomain(v, FLAGS[str(info.field_name)])

    @field_validator("server_image", "pipeline_image")
    @classmethod
    def _image(cls, v: str, info: ValidationInfo) -> str:
        return names.image_reference(v, FLAGS[str(info.field_name)])


def work_bytes(spec: BuildSpec, *, download: bool) -> int:
    """Disk WORK holds on a node: the unpacked release, plus its tarball when it is downloaded there (`download`:
    --release-url; a --release-volume tarball is read in place), with WORK_MARGIN and WORK_HEADROOM."""
    release = plan_resources(spec).stage_bytes("release", needed=False)
    copies = 2 if download else 1
    return int(copies * release * (1 + WORK_MARGIN)) + WORK_HEADROOM


def quantity(nbytes: int) -> str:
    """`nbytes` rounded up to a whole GiB, as a Kubernetes quantity."""
    return f"{math.ceil(nbytes / GIB)}Gi"


def _meta(o: K8sOptions, name: str, **labels: str) -> dict[str, Any]:
    base = {"app.kubernetes.io/name": "trtllm-pipeline", "app.kubernetes.io/instance": o.name}
    return {"name": name, "namespace": o.namespace, "labels": {**base, **labels}}


def _env(**values: str | None) -> list[dict[str, Any]]:
    return [{"name": k, "value": str(v)} for k, v in values.items() if v is not None]


def _work_size(o: K8sOptions) -> str:
    if o.work_bytes is None:
        raise ValueError("K8sOptions.work_bytes is required to render serving pods")
    return quantity(o.work_bytes)


def _resources(o: K8sOptions, gpus: int) -> dict[str, Any]:
    """GPU limit, and the WORK volume's size as ephemeral-storage request = limit (a pod's effective request is the
    larger of its init container's and the sum of its app containers', so the two don't add up)."""
    return {"requests": {EPHEMERAL: _work_size(o)}, "limits": {GPU: str(gpus), EPHEMERAL: _work_size(o)}}


def _server_resources(o: K8sOptions, gpus: int) -> dict[str, Any]:
    """`_resources` plus host CPU and memory (requested; memory limited at MEMORY_LIMIT_FACTOR x) and the extended
    resources (request = limit, as Kubernetes requires of them)."""
    r = _resources(o, gpus)
    if o.cpus is not None:
        r["requests"]["cpu"] = str(o.cpus)
    if o.memory_bytes is not None:
        r["requests"]["memory"] = quantity(o.memory_bytes)
        r["limits"]["memory"] = quantity(int(o.memory_bytes * scheduling.MEMORY_LIMIT_FACTOR))
    r["requests"] |= o.extra_resources
    r["limits"] |= o.extra_resources
    return r


def _fetch_container(o: K8sOptions, gpus: int, *, copy_kubectl: bool) -> dict[str, Any]:
    env = _env(WORK=WORK, PIPELINE=o.pipeline_cmd, RELEASE_FILE=o.release_file, RELEASE_URL=o.release_url,
               RELEASE_DIR="/releases" if o.release_pvc else None, RELEASE_SHA256=o.sha256,
               COPY_KUBECTL="1" if copy_kubectl else None)
    if o.release_secret:
        env.append({"name": "RELEASE_AUTH_HEADER",
                    "valueFrom": {"secretKeyRef": {"name": o.release_secret, "key": "header"}}})
    mounts: list[dict[str, Any]] = [{"name": "work", "mountPath": WORK}, {"name": "config", "mountPath": CONFIG}]
    if o.release_pvc:
        mounts.append({"name": "releases", "mountPath": "/releases", "readOnly": True})
    return {"name": "fetch-verify", "image": o.pipeline_image, "command": ["/bin/sh", f"{CONFIG}/fetch-verify.sh"],
            "env": env, "resources": _resources(o, gpus), "volumeMounts": mounts}


READY_SCRIPT = "ready.sh"  # the ConfigMap's readiness check, for a runtime that has one (Runtime.ready_script)
# The exec readiness probe: every 5 s, out of the Service after two failures (a dead stub: within 10 s; the watchdog
# stops the server within STUB_WATCH_SECONDS plus its stop grace).
READY_PERIOD_S, READY_FAILURES, READY_TIMEOUT_S = 5, 2, 5


def _probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": HTTP_PORT}, "periodSeconds": period, "failureThreshold": failures}


def _readiness(rt: Runtime) -> dict[str, Any]:
    """The runtime's readiness check (exec) when it has one, else its HTTP ready path."""
    if not rt.ready_script:
        return _probe(rt.ready_path, 10, 3)
    return {"exec": {"command": ["/bin/sh", f"{CONFIG}/{READY_SCRIPT}"]}, "periodSeconds": READY_PERIOD_S,
            "failureThreshold": READY_FAILURES, "timeoutSeconds": READY_TIMEOUT_S}


def _server_container(o: K8sOptions, rt: Runtime | None, gpus: int, command: list[str],
                      env: list[dict[str, Any]]) -> dict[str, Any]:
    c: dict[str, Any] = {
        "name": "server", "image": o.server_image, "command": command,
        "env": [*_env(WORK=WORK), *env, *_env(**o.nccl_env)], "resources": _server_resources(o, gpus),
        "volumeMounts": [{"name": "work", "mountPath": WORK}, {"name": "config", "mountPath": CONFIG},
                         {"name": "dshm", "mountPath": "/dev/shm"}],
    }
    if o.extra_resources:  # RDMA registers (pins) memory
        c["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
    if rt is not None:  # the pod that serves the endpoints
        c["ports"] = [{"name": n, "containerPort": port} for n, port in rt.ports]
        c["startupProbe"] = _probe(rt.ready_path, 10, 360)  # engines of a large model load for many minutes
        c["readinessProbe"] = _readiness(rt)
        c["livenessProbe"] = _probe(rt.live_path, 30, 3)  # a hung server; a dead stub: the watchdog exits
    return c


def _pod_spec(o: K8sOptions, server: dict[str, Any], gpus: int, *, copy_kubectl: bool = False,
              service_account: str | None = None) -> dict[str, Any]:
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": f"{o.name}-scripts", "defaultMode": SCRIPT_MODE}},
        {"name": "work", "emptyDir": {"sizeLimit": _work_size(o)}},
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
    ]
    if o.release_pvc:
        volumes.append({"name": "releases", "persistentVolumeClaim": {"claimName": o.release_pvc, "readOnly": True}})
    spec: dict[str, Any] = {"initContainers": [_fetch_container(o, gpus, copy_kubectl=copy_kubectl)],
                            "containers": [server], "volumes": volumes}
    if service_account:
        spec["serviceAccountName"] = service_account
    return spec | _placement(o, gpus)


def _placement(o: K8sOptions, gpus: int) -> dict[str, Any]:
    """nodeSelector, and for a pod with GPUs the tolerations and GPU-product node affinity."""
    out: dict[str, Any] = {"nodeSelector": o.node_selector} if o.node_selector else {}
    if gpus and o.tolerations:
        out["tolerations"] = o.tolerations
    if gpus and o.gpu_products:
        out["affinity"] = scheduling.node_affinity(o.gpu_products)
    return out


def config_map(o: K8sOptions, scripts: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(o, f"{o.name}-scripts"), "data": scripts}


def service(o: K8sOptions, rt: Runtime, selector: dict[str, str]) -> dict[str, Any]:
    ports = [{"name": n, "port": p, "targetPort": p} for n, p in rt.ports]
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(o, o.name),
            "spec": {"selector": selector, "ports": ports}}


def deployment(o: K8sOptions, rt: Runtime, p: Placement) -> dict[str, Any]:
    """One node: the pod runs every rank (mpirun on the pod itself when the runtime wants world-size ranks), or the
    runtime's one process."""
    command = ["/bin/sh", f"{CONFIG}/rank.sh"]
    if rt.ranks_launched and p.world_size > 1:
        command = ["mpirun", "--allow-run-as-root", "-np", str(p.world_size), "-x", "WORK", *command]
    labels = server_pod_selector(o.name, multi_node=False)
    server = _server_container(o, rt, p.ranks_per_node, command, [])
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(o, o.name),
            "spec": {"replicas": o.replicas, "strategy": {"type": "Recreate"}, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": _pod_spec(o, server, p.ranks_per_node)}}}


def leader_worker_set(o: K8sOptions, rt: Runtime, p: Placement) -> dict[str, Any]:
    """Several nodes: group size = nodes; the leader (ranks 0..N-1) mpiruns the workers' ranks over kubectl exec."""
    gpus = p.ranks_per_node
    leader_env = [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                  *_env(RANKS_PER_NODE=str(gpus), WORLD_SIZE=str(p.world_size))]
    leader = _server_container(o, rt, gpus, ["/bin/sh", f"{CONFIG}/launch-leader.sh"], leader_env)
    # A worker idles; mpirun starts its ranks in it through kubectl exec.
    worker = _server_container(o, None, gpus, ["/bin/sh", "-c", "exec sleep infinity"], [])
    account = f"{o.name}-launcher"
    return {
        "apiVersion": LWS_API, "kind": "LeaderWorkerSet", "metadata": _meta(o, o.name),
        "spec": {
            "replicas": o.replicas,
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": p.nodes,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": {"metadata": {"labels": {"role": "leader"}},
                                   "spec": _pod_spec(o, leader, gpus, copy_kubectl=True, service_account=account)},
                "workerTemplate": {"metadata": {"labels": {"role": "worker"}},
                                   "spec": _pod_spec(o, worker, gpus, service_account=account)},
            },
        },
    }


def launcher_rbac(o: K8sOptions) -> list[dict[str, Any]]:
    """What the leader's launcher needs: read its group's pods and exec into them (mpirun's remote shell)."""
    name = f"{o.name}-launcher"
    rules = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
             {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create"]}]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(o, name)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(o, name), "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": _meta(o, name),
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": o.namespace}],
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}},
    ]


def server_pod_selector(name: str, *, multi_node: bool) -> dict[str, str]:
    """Labels of the pod that serves HTTP and metrics: the Deployment's pod, or a LeaderWorkerSet's leader (its
    `role` from the leader template, the set's name label from the LWS controller)."""
    if multi_node:
        return {LWS_NAME_LABEL: name, "role": "leader"}
    return {"app.kubernetes.io/instance": name, "app.kubernetes.io/component": "server"}


def serving_objects(o: K8sOptions, rt: Runtime, p: Placement, scripts: dict[str, str]) -> list[dict[str, Any]]:
    selector = server_pod_selector(o.name, multi_node=p.multi_node)
    if not p.multi_node:
        return [config_map(o, scripts), deployment(o, rt, p), service(o, rt, selector)]
    return [config_map(o, scripts), *launcher_rbac(o), leader_worker_set(o, rt, p), service(o, rt, selector)]


def matrix_job(o: K8sOptions, cells: int, gpus: int, scripts: dict[str, str]) -> list[dict[str, Any]]:
    """An Indexed Job: index i builds and releases matrix cell i into the output volume (`gpus` per pod)."""
    env = [*_env(PIPELINE=o.pipeline_cmd, OUTPUT="/output", PIPELINE_CACHE="/output/cache"),
           {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": o.hf_secret, "key": "HF_TOKEN"}}}]
    container: dict[str, Any] = {
        "name": "build", "image": o.pipeline_image, "command": ["/bin/sh", f"{CONFIG}/build-cell.sh"], "env": env,
        "volumeMounts": [{"name": "output", "mountPath": "/output"}, {"name": "config", "mountPath": CONFIG}],
    }
    requests = {k: v for k, v in (("cpu", o.cpus and str(o.cpus)),
                                  ("memory", o.memory_bytes and quantity(o.memory_bytes))) if v}
    limits = {GPU: str(gpus)} if gpus else {}
    if o.memory_bytes:
        limits["memory"] = quantity(int(o.memory_bytes * scheduling.MEMORY_LIMIT_FACTOR))
    if requests or limits:
        container["resources"] = {k: v for k, v in (("requests", requests), ("limits", limits)) if v}
    pod = {"restartPolicy": "Never", "containers": [container],
           "volumes": [{"name": "output", "persistentVolumeClaim": {"claimName": o.output_pvc}},
                       {"name": "config", "configMap": {"name": f"{o.name}-scripts", "defaultMode": SCRIPT_MODE}}],
           **_placement(o, gpus)}
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": _meta(o, f"{o.name}-build"),
           "spec": {"completionMode": "Indexed", "completions": cells, "parallelism": cells,
                    "backoffLimitPerIndex": 1, "template": {"spec": pod}}}
    return [config_map(o, scripts), job]
