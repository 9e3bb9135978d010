"""A minimal, offline ``kustomize build`` for the manifests under ``deploy/k8s``.

Why: the tests check what an overlay renders to (references between objects,
labels, ports), and neither kustomize nor kubectl is available where the tests
run. This models exactly the kustomize features the manifests use —
``resources``, ``components``, strategic-merge ``patches`` matched by
kind/name, and ``namespace`` — and refuses any other field, so a manifest that
starts using a feature this model does not know fails loudly instead of being
rendered wrongly.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

KUSTOMIZATION_FILE = "kustomization.yaml"
SUPPORTED_FIELDS = {"apiVersion", "kind", "resources", "components", "patches", "namespace"}
SUPPORTED_PATCH_FIELDS = {"path"}
CLUSTER_SCOPED_KINDS = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
}

#: Strategic-merge keys of the Kubernetes lists the manifests patch; every
#: other list is replaced whole, as Kubernetes' strategic merge does.
LIST_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "imagePullSecrets": "name",
}

Object = dict[str, Any]


class KustomizeError(Exception):
    """The manifests ask for something kustomize would reject (or this model does not know)."""


def load_documents(path: Path) -> list[Object]:
    """The non-empty YAML documents of a file."""
    with path.open() as stream:
        return [doc for doc in yaml.safe_load_all(stream) if doc is not None]


def read_kustomization(directory: Path, expected_kind: str) -> Object:
    """A directory's kustomization, checked for its kind and for fields this model supports."""
    path = directory / KUSTOMIZATION_FILE
    if not path.is_file():
        raise KustomizeError(f"{directory} has no {KUSTOMIZATION_FILE}")
    (kustomization,) = load_documents(path)
    if kustomization.get("kind", "Kustomization") != expected_kind:
        raise KustomizeError(
            f"{path}: kind {kustomization.get('kind')!r}, expected {expected_kind}"
        )
    unsupported = set(kustomization) - SUPPORTED_FIELDS
    if unsupported:
        raise KustomizeError(
            f"{path}: fields {sorted(unsupported)} are not modelled by tests/deploy/kustomize.py"
        )
    for patch in kustomization.get("patches", []):
        if set(patch) != SUPPORTED_PATCH_FIELDS:
            raise KustomizeError(f"{path}: only `patches: - path: FILE` is modelled, got {patch}")
    return kustomization


def build(directory: Path, extra_components: Sequence[Path] = ()) -> list[Object]:
    """Render a Kustomization directory, optionally with more components (as if listed last)."""
    objects = _render(
        directory.resolve(), [], "Kustomization", [c.resolve() for c in extra_components]
    )
    _check_unique(objects)
    return objects


def _render(
    directory: Path, inherited: list[Object], kind: str, extra_components: Sequence[Path] = ()
) -> list[Object]:
    """Kustomize's order: resources, then components, then this level's patches and namespace."""
    kustomization = read_kustomization(directory, kind)
    objects = list(inherited)
    for entry in kustomization.get("resources", []):
        objects.extend(_load_resource(directory / entry))
    for component in [
        *(directory / c for c in kustomization.get("components", [])),
        *extra_components,
    ]:
        objects = _render(component.resolve(), objects, "Component")
    for patch in kustomization.get("patches", []):
        for document in load_documents(directory / patch["path"]):
            objects = apply_patch(objects, document, source=directory / patch["path"])
    namespace = kustomization.get("namespace")
    return [set_namespace(obj, namespace) for obj in objects] if namespace else objects


def _load_resource(path: Path) -> list[Object]:
    if path.is_dir():
        return _render(path.resolve(), [], "Kustomization")
    if not path.is_file():
        raise KustomizeError(f"resource {path} does not exist")
    return [copy.deepcopy(doc) for doc in load_documents(path)]


def identity(obj: Object) -> tuple[str, str, str | None, str]:
    """What kustomize matches on: API group, kind, namespace, name."""
    group = obj["apiVersion"].rpartition("/")[0]
    return group, obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"]


def _check_unique(objects: Iterable[Object]) -> None:
    seen: set[tuple] = set()
    for obj in objects:
        key = identity(obj)
        if key in seen:
            raise KustomizeError(f"two objects with the same identity {key}")
        seen.add(key)


def apply_patch(objects: list[Object], patch: Object, source: Path) -> list[Object]:
    """Strategic-merge ``patch`` into the one object with its group, kind and name."""
    group, kind, _, name = identity(patch)
    targets = [
        i
        for i, obj in enumerate(objects)
        if identity(obj)[:2] == (group, kind) and obj["metadata"]["name"] == name
    ]
    if len(targets) != 1:
        raise KustomizeError(
            f"{source}: patch for {kind}/{name} matches {len(targets)} objects, expected 1"
        )
    patched = list(objects)
    patched[targets[0]] = strategic_merge(objects[targets[0]], patch)
    return patched


def strategic_merge(base: Any, patch: Any, field: str | None = None) -> Any:
    """Kubernetes strategic merge for the cases used: maps merge, null deletes, keyed lists
    merge."""
    if isinstance(base, dict) and isinstance(patch, dict):
        return _merge_maps(base, patch)
    merge_key = _list_merge_key(field, base, patch)
    if merge_key and isinstance(base, list) and isinstance(patch, list):
        return _merge_lists(base, patch, merge_key, field)
    return copy.deepcopy(patch)


def _merge_maps(base: Object, patch: Object) -> Object:
    merged = copy.deepcopy(base)
    for key, value in patch.items():
        if key.startswith("$"):
            raise KustomizeError(f"patch directive {key} is not modelled")
        if value is None:
            merged.pop(key, None)
        elif key in merged:
            merged[key] = strategic_merge(merged[key], value, key)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _list_merge_key(field: str | None, base: Any, patch: Any) -> str | None:
    if field == "ports" and isinstance(patch, list):
        # Container ports merge on containerPort, Service ports on port.
        return "containerPort" if all("containerPort" in item for item in patch) else "port"
    return LIST_MERGE_KEYS.get(field or "")


def _merge_lists(base: list, patch: list, merge_key: str, field: str | None) -> list:
    merged = copy.deepcopy(base)
    for item in patch:
        if merge_key not in item:
            raise KustomizeError(f"patch item of {field} lacks its merge key {merge_key}: {item}")
        index = next(
            (i for i, old in enumerate(merged) if old.get(merge_key) == item[merge_key]), None
        )
        if index is None:
            merged.append(copy.deepcopy(item))
        else:
            merged[index] = strategic_merge(merged[index], item)
    return merged


def set_namespace(obj: Object, namespace: str) -> Object:
    """Kustomize's namespace transformer: namespaced objects move, RBAC subjects stay.

    Like kustomize's default (``setRoleBindingSubjects: defaultOnly``), only
    subjects named ``default`` follow; every other subject keeps the namespace
    written in the manifest, which is why the tests check it explicitly.
    """
    moved = copy.deepcopy(obj)
    if obj["kind"] not in CLUSTER_SCOPED_KINDS:
        moved["metadata"]["namespace"] = namespace
    for subject in (
        moved.get("subjects", []) if obj["kind"] in ("RoleBinding", "ClusterRoleBinding") else []
    ):
        if subject.get("name") == "default":
            subject["namespace"] = namespace
    return moved
