"""The public API is importable where the docs name it: ``antdt.worker``, ``antdt.worker.preduce``,
``antdt.worker.ps``; an unknown name is a plain AttributeError."""

from __future__ import annotations

import importlib

import pytest


@pytest.mark.parametrize("package", ["antdt.worker", "antdt.worker.preduce", "antdt.worker.ps"])
def test_every_exported_name_resolves_to_the_object_its_module_defines(package):
    module = importlib.import_module(package)
    assert module.__all__
    for name in module.__all__:
        value = getattr(module, name)
        assert getattr(value, "__name__", name) == name or not callable(value)


def test_the_partial_reduce_job_and_its_parts_import_as_the_docs_show():
    from antdt.worker import PartialReduceJob as from_worker
    from antdt.worker.preduce import GroupAverager, GroupClient, PartialReduceJob

    assert PartialReduceJob is from_worker
    assert PartialReduceJob.__module__ == "antdt.worker.preduce.job"
    assert GroupClient.__module__ == "antdt.worker.preduce.client"
    assert GroupAverager.__module__ == "antdt.worker.preduce.averaging"


def test_an_unknown_name_is_an_attribute_error_naming_the_package():
    import antdt.worker.preduce as preduce

    with pytest.raises(AttributeError, match="'antdt.worker.preduce' has no attribute 'Nope'"):
        preduce.Nope  # noqa: B018
