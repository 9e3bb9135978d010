"""Validation of Kubernetes and custom resources against the vendored JSON schemas.

Why: the manifests are written for real clusters, but no cluster (and no
network) is available to the tests, so the API server's own validation is
replaced by the schemas it is generated from, vendored under
``deploy/schemas/k8s`` (sources and commits in ``deploy/schemas/README.md``).
A kind without a vendored schema is an error, never a silent pass.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft7Validator, validators

REPO = Path(__file__).resolve().parents[2]
SCHEMA_ROOT = REPO / "deploy" / "schemas" / "k8s"
KUBERNETES_SCHEMAS = SCHEMA_ROOT / "kubernetes-v1.31.0-standalone-strict"
KUSTOMIZATION_SCHEMA = SCHEMA_ROOT / "kustomization.json"

#: Every vendored schema is draft-07 or older-compatible (the Kubernetes ones
#: say only "http://json-schema.org/schema#"), so one draft is used for all.
FullValidator = Draft7Validator
#: Patches are partial objects: checked for unknown fields and wrong types,
#: with ``required`` switched off (the rendered objects get the full check).
PartialValidator = validators.extend(Draft7Validator, {"required": lambda *_: iter(())})


def schema_path(api_version: str, kind: str) -> Path:
    """Where the schema of an apiVersion/kind lives.

    Custom resources follow datreeio/CRDs-catalog (``<group>/<kind>_<version>.json``),
    built-in kinds yannh/kubernetes-json-schema (``<kind>[-<group head>]-<version>.json``).
    """
    group, _, version = api_version.rpartition("/")
    if group:
        custom = SCHEMA_ROOT / group / f"{kind.lower()}_{version}.json"
        if custom.is_file():
            return custom
    group_part = f"-{group.split('.')[0]}" if group else ""
    return KUBERNETES_SCHEMAS / f"{kind.lower()}{group_part}-{version}.json"


@cache
def load_schema(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise FileNotFoundError(f"no vendored schema {path.relative_to(REPO)}")
    return json.loads(path.read_text())


def schema_errors(document: dict[str, Any], partial: bool = False) -> list[str]:
    """Every schema violation of one object, as ``path: message`` lines (empty: valid)."""
    path = schema_path(document.get("apiVersion", ""), document.get("kind", ""))
    schema = load_schema(path)
    validator = (PartialValidator if partial else FullValidator)(schema)
    return [
        _describe(error)
        for error in sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path))
    ]


def kustomization_errors(document: dict[str, Any]) -> list[str]:
    """Violations of the SchemaStore kustomization schema."""
    schema = load_schema(KUSTOMIZATION_SCHEMA)
    validator = FullValidator(schema)
    return [_describe(error) for error in validator.iter_errors(document)]


def _describe(error) -> str:
    where = "/".join(str(part) for part in error.absolute_path) or "(root)"
    return f"{where}: {error.message[:300]}"
