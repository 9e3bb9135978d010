"""The Grafana dashboard in deploy/grafana: it parses, and every metric its PromQL names exists.

"Exists" means served by a real registry: the agent's, scraped from a
running agent's ``/metrics`` against the embedded broker, and the services',
as each service's metrics module registers them (the registry their
``/metrics`` serves). The names come from the exposition, not from a list
kept here, so a renamed metric breaks this test, not the dashboard.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import antdt.services
from antdt.runtime.launch import http_get
from antdt.settings import load_settings
from antdt.worker import Agent

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "antdt.json"
#: The series names a family of each type exposes (``_created`` is never worth a panel).
SERIES_SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "summary": ("", "_sum", "_count"),
    "info": ("_info",),
    "stateset": ("",),
    "unknown": ("",),
}
#: Words of PromQL that look like names but are not metrics.
KEYWORDS = {
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "offset",
    "bool",
    "inf",
    "nan",
}
STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
# label matchers {..}, ranges and subqueries [..], and the label lists of grouping modifiers
NOT_NAMES = re.compile(
    r"\{[^}]*\}|\[[^\]]*\]|\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)"
)
# a whole identifier, not part of a number or duration, not a function called
IDENTIFIER = re.compile(r"(?<![\w$:.])[A-Za-z_:][\w:]*(?![\w:])(?!\s*\()")
LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+),\s*(?P<label>\w+)\)$")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects."""
    bare = NOT_NAMES.sub(" ", STRINGS.sub('""', expr))
    return {name for name in IDENTIFIER.findall(bare) if name not in KEYWORDS}


def exposed_series(text: str) -> set[str]:
    """Every series name a Prometheus text exposition serves, families without samples included."""
    return {
        family.name + suffix
        for family in text_string_to_metric_families(text)
        for suffix in SERIES_SUFFIXES[family.type]
    }


def panels(dashboard: dict) -> list[dict]:
    """Every panel, those inside collapsed rows included."""
    found = []
    for panel in dashboard["panels"]:
        found.append(panel)
        found += panel.get("panels", [])
    return found


def expressions(dashboard: dict) -> dict[str, str]:
    """Each PromQL expression, keyed by where it is (panel title and refId, or variable)."""
    found = {
        f"{panel['title']}/{target['refId']}": target["expr"]
        for panel in panels(dashboard)
        for target in panel.get("targets", [])
    }
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = LABEL_VALUES.match(variable["query"]["query"])
            assert query, f"variable {variable['name']}: expected label_values(selector, label)"
            found[f"variable {variable['name']}"] = query["selector"]
    return found


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


@pytest.fixture(scope="module")
def service_series() -> set[str]:
    """What the services' /metrics serve: their metrics modules register into the default
    registry."""
    for service in pkgutil.iter_modules(antdt.services.__path__):
        if (Path(service.module_finder.path) / service.name / "metrics.py").exists():
            importlib.import_module(f"antdt.services.{service.name}.metrics")
    return exposed_series(generate_latest(REGISTRY).decode())


@pytest.fixture
def agent_series(settings, topics) -> set[str]:
    """What a running agent's /metrics serves."""
    metered = load_settings(**{**settings.model_dump(), "agent_metrics_port": 0})
    with Agent("job-grafana", "w0", settings=metered, listen_for_commands=False) as agent:
        status, text = http_get(agent.metrics.port, "/metrics")
    assert status == 200
    return exposed_series(text)


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (le) (rate(a_bucket{job=~"$job"}[$__rate_interval]))', {"a_bucket"}),
        ("x / ignoring (part) group_left sum(y[5m] offset 1h)", {"x", "y"}),
        ("count(up_total > 30) or vector(0)", {"up_total"}),
        ('histogram_quantile(0.99, sum(rate(b_sum{l="by (x)"}[1m:10s]))) > 1e3', {"b_sum"}),
    ],
)
def test_metric_names_are_read_from_promql(expr, names):
    assert metric_names(expr) == names


def test_the_dashboard_is_a_grafana_model_on_a_chosen_prometheus(dashboard):
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [panel["id"] for panel in panels(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    for panel in panels(dashboard):
        if panel["type"] == "row":
            continue
        assert panel["targets"], f"{panel['title']}: no query"
        for source in [panel["datasource"]] + [t["datasource"] for t in panel["targets"]]:
            assert source == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]


def test_every_metric_the_dashboard_names_exists(dashboard, service_series, agent_series):
    served = service_series | agent_series
    unknown = {
        where: sorted(metric_names(expr) - served)
        for where, expr in expressions(dashboard).items()
        if metric_names(expr) - served
    }
    assert not unknown, f"names no registry serves: {unknown}"
    assert all(metric_names(expr) for expr in expressions(dashboard).values())


def test_it_covers_every_service_and_everything_an_agent_serves(dashboard, agent_series):
    named = set().union(*map(metric_names, expressions(dashboard).values()))
    components = {name.split("_")[1] for name in named}
    assert {"agent", "monitor", "controller", "sharder"} <= components
    agent_families = {
        name.removesuffix("_total") for name in agent_series if name.startswith("antdt_agent_")
    }
    shown = {name.removesuffix("_total") for name in named}
    assert agent_families <= shown, f"agent metrics without a panel: {agent_families - shown}"
