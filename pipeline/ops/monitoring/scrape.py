"""How Prometheus finds a deployment's metrics port and scrapes it as `job="<deployment>"`, the label every rule
selects on (`rules.WatchPlan.selector`).

Kubernetes: a prometheus-operator `PodMonitor` (monitoring.coreos.com/v1) on the serving pods' metrics port and path
(Triton: `metrics`, /metrics; trtllm-serve: `http`, /prometheus/metrics) whose relabeling sets `job` to the deployment
name. Slurm: the node list is known only when the job runs, so serve.sbatch
writes a file_sd target file (`[{"targets": ["<first node>:<port>"], "labels": {"job": "<deployment>"}}]`) and
`scrape_config_file` is the `scrape_configs` entry that reads it.
"""

from __future__ import annotations

from typing import Any

import yaml

from pipeline.core.errors import DeployError

METRICS_PATH = "/metrics"  # Triton's
FILE_SD_GLOB = frozenset("*?[")  # Prometheus globs file_sd paths (a '*' only in the last segment)


def pod_monitor(deployment: str, *, namespace: str, labels: dict[str, str], pod_selector: dict[str, str],
                port: str, path: str = METRICS_PATH) -> dict[str, Any]:
    """A PodMonitor scraping `path` on the named container `port` of the pods matching `pod_selector` in
    `namespace`."""
    endpoint = {"port": port, "path": path,
                "relabelings": [{"action": "replace", "targetLabel": "job", "replacement": deployment}]}
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
            "metadata": {"name": f"{deployment}-trtllm", "namespace": namespace, "labels": labels},
            "spec": {"selector": {"matchLabels": dict(pod_selector)}, "podMetricsEndpoints": [endpoint]}}


def scrape_config(deployment: str, targets_file: str, *, path: str = METRICS_PATH) -> dict[str, Any]:
    """One `scrape_configs` entry: job `deployment`, targets from the file_sd file(s) `targets_file` (a glob in its
    last segment: one file per replica; their `job` label wins)."""
    directory = targets_file.rsplit("/", 1)[0]
    if FILE_SD_GLOB & set(directory):
        raise DeployError(f"--output {directory!r}: Prometheus reads file_sd target files by "
                          "glob pattern, so the deployment directory cannot hold '*', '?' or '['; choose another")
    return {"job_name": deployment, "honor_labels": True, "metrics_path": path,
            "file_sd_configs": [{"files": [targets_file]}]}


def scrape_config_file(deployment: str, targets_file: str, *, path: str = METRICS_PATH) -> str:
    """`prometheus-scrape.yml`: `scrape_configs:` to merge into prometheus.yml (Prometheus must read `targets_file`:
    a shared filesystem)."""
    return yaml.safe_dump({"scrape_configs": [scrape_config(deployment, targets_file, path=path)]}, sort_keys=False,
                          width=120)
