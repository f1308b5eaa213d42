"""Offline validation of a rendered DynamoGraphDeployment; every failure names the object, the field and the rule.

Three layers, each an error rather than a pass when it cannot check:
- the v1beta1 `openAPIV3Schema` (schemas/dynamographdeployment-v1beta1.json, which names its source), made strict as
  `pipeline.ops.deploy.validate` makes the other CRDs (undeclared fields refused);
- the CRD's CEL rules (`x-kubernetes-validations`), which a JSON-schema validator does not run, re-stated here:
  component names unique case-insensitively, at most one `epp` component, `eppConfig` only on an `epp` component,
  `minAvailable` <= `replicas` (unless 0), `spec.restart` unset on create; and the operator's admission rule that
  every component's `podTemplate` holds a container named `main` with an image;
- each `podTemplate` as the Kubernetes core/v1 PodTemplateSpec it is (strict `kubernetes-validate`).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jsonschema

from pipeline.core.errors import DeployError
from pipeline.ops.deploy.validate import SCHEMAS, _strict, _where, validate_object

DGD_SCHEMA = SCHEMAS / "dynamographdeployment-v1beta1.json"
DGD_KIND = "DynamoGraphDeployment"
MAIN_CONTAINER = "main"  # the operator merges its defaults into the container of this name


@functools.cache
def schema_document(path: Path = DGD_SCHEMA) -> dict[str, Any]:
    return json.loads(path.read_text())


@functools.cache
def _validator(path: Path) -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(_strict(schema_document(path)["openAPIV3Schema"]))


def _cel_errors(spec: dict[str, Any]) -> list[str]:
    """What the CRD's CEL rules (and the main-container admission rule) refuse in a schema-valid `spec`."""
    errors = []
    components = spec.get("components") or []
    seen: dict[str, str] = {}
    for c in components:
        key = c["name"].lower()
        if key in seen:
            errors.append(f"spec.components: component names must be unique case-insensitively ({seen[key]!r} and "
                          f"{c['name']!r})")
        seen.setdefault(key, c["name"])
    if sum(c.get("type") == "epp" for c in components) > 1:
        errors.append("spec.components: at most one component may have type epp")
    if "restart" in spec:
        errors.append("spec.restart: must be unset on create; set spec.restart.id after creation to request a restart")
    for i, c in enumerate(components):
        where = f"spec.components.{i} ({c['name']})"
        if "eppConfig" in c and c.get("type") != "epp":
            errors.append(f"{where}: eppConfig may only be set when type is epp")
        replicas = c.get("replicas", 1)
        if "minAvailable" in c and replicas != 0 and c["minAvailable"] > replicas:
            errors.append(f"{where}: minAvailable must be less than or equal to replicas unless replicas is 0")
        containers = ((c.get("podTemplate") or {}).get("spec") or {}).get("containers") or []
        if not any(ct.get("name") == MAIN_CONTAINER and ct.get("image") for ct in containers):
            errors.append(f"{where}: podTemplate needs a container named {MAIN_CONTAINER!r} with an image (the "
                          "operator merges its defaults into it)")
    return errors


def dgd_errors(obj: dict[str, Any], *, api_version: str, schema: Path = DGD_SCHEMA) -> list[str]:
    """Every problem found in DynamoGraphDeployment `obj` (empty: valid), `api_version` the one expected."""
    if obj.get("apiVersion") != api_version or obj.get("kind") != DGD_KIND:
        return [f"apiVersion/kind {obj.get('apiVersion')!r} {obj.get('kind')!r}: expected {api_version} {DGD_KIND}"]
    schema_errors = sorted(_validator(schema).iter_errors(obj), key=lambda e: list(e.absolute_path))
    errors = [f"{_where(e)}: {e.message}" for e in schema_errors]
    if errors:
        return errors  # the CEL rules assume the schema's types
    errors = _cel_errors(obj.get("spec") or {})
    for i, c in enumerate(obj["spec"].get("components") or []):
        if "podTemplate" not in c:
            continue
        wrapper = {"apiVersion": "v1", "kind": "PodTemplate",
                   "metadata": {"name": c["name"].lower()}, "template": c["podTemplate"]}
        try:
            validate_object(wrapper)
        except DeployError as exc:
            errors.append(f"spec.components.{i}.podTemplate ({c['name']}): {exc}")
    return errors


def validate_dgd(obj: dict[str, Any], *, api_version: str, schema: Path = DGD_SCHEMA) -> None:
    """Raise `DeployError` (the first problem, and how many there are) unless `obj` is valid."""
    errors = dgd_errors(obj, api_version=api_version, schema=schema)
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        name = (obj.get("metadata") or {}).get("name", "?")
        raise DeployError(f"{DGD_KIND} {name} fails the Dynamo CRD checks at {errors[0]}{more}")
