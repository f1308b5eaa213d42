"""Offline, strict validation of rendered Kubernetes objects; any failure names the object, the field and the rule.

Core kinds: the Kubernetes OpenAPI schemas shipped by `kubernetes-validate` (strict variant: unknown fields refused).
LeaderWorkerSet, PrometheusRule and PodMonitor: their CRDs' `openAPIV3Schema` (schemas/leaderworkerset-v1.json from
kubernetes-sigs/lws, schemas/prometheusrule-v1.json and schemas/podmonitor-v1.json from prometheus-operator v0.82.2;
each file names its source commit), made strict
the way `kubeconform -strict` is: every object schema with declared properties refuses undeclared ones. A kind with
no schema here is an error, never a pass.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate

from pipeline.core.errors import DeployError

K8S_VERSION = "1.31"
SCHEMAS = Path(__file__).parent / "schemas"
LWS_SCHEMA = SCHEMAS / "leaderworkerset-v1.json"
CUSTOM_KINDS: dict[tuple[object, object], Path] = {("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): LWS_SCHEMA,
                ("monitoring.coreos.com/v1", "PrometheusRule"): SCHEMAS / "prometheusrule-v1.json",
                ("monitoring.coreos.com/v1", "PodMonitor"): SCHEMAS / "podmonitor-v1.json"}


def _strict(schema: Any) -> Any:
    """`schema` with `additionalProperties: false` on every object that declares properties and allows no extras."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@functools.cache
def _crd_validator(path: Path) -> jsonschema.Draft7Validator:
    doc = json.loads(path.read_text())
    return jsonschema.Draft7Validator(_strict(doc["openAPIV3Schema"]))


def _where(error: jsonschema.ValidationError) -> str:
    return ".".join(str(p) for p in error.absolute_path) or "(top level)"


def validate_object(obj: dict[str, Any]) -> None:
    """Raise `DeployError` unless `obj` passes its kind's schema (strict)."""
    kind, api = obj.get("kind"), obj.get("apiVersion")
    label = f"{kind} {obj.get('metadata', {}).get('name', '?')}"
    custom = CUSTOM_KINDS.get((api, kind))
    if custom is not None:
        error = jsonschema.exceptions.best_match(_crd_validator(custom).iter_errors(obj))
        if error is not None:
            raise DeployError(f"{label} fails the {api} CRD schema at {_where(error)}: {error.message}")
        return
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        raise DeployError(f"{label}: no schema for {api} {kind}; only core kinds, LeaderWorkerSet, "
                          "PrometheusRule and PodMonitor are validated, so it is refused") from None
    except kubernetes_validate.ValidationError as exc:  # carries the jsonschema error's path and message
        raise DeployError(f"{label} fails the Kubernetes {K8S_VERSION} schema at {_where(exc)}: "
                          f"{exc.message}") from None


def validate_objects(objects: list[dict[str, Any]]) -> None:
    for obj in objects:
        validate_object(obj)
