"""What the dashboards share: the provisioned datasource, template variables, panel helpers."""
from __future__ import annotations

from grafanalib.core import DataSourceInput, GridPos, Table, Target, Template, TimeSeries

# Every panel reads the Prometheus the `datasource` variable picks: the default one where the dashboard is
# provisioned (docker-compose.yaml), the one chosen at import elsewhere (__inputs): no uid to edit.
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
INPUTS = [DataSourceInput(name="DS_PROMETHEUS", label="Prometheus", pluginId="prometheus", pluginName="Prometheus",
                          description="the Prometheus (or compatible) that scrapes gpu-spatial-exporter")]
GPU_SELECTOR = 'instance=~"$host", gpu=~"$gpu"'
# Series every GPU has wherever it comes from: live exporters publish time utilization (NVML) and, with a
# spatial source, SM active; an export backfilled with `nsys-ingest openmetrics` carries SM active only.
GPU_SERIES = '__name__=~"gpu_time_utilization_ratio|gpu_sm_active_ratio"'


def datasource_variable() -> Template:
    # ${DS_PROMETHEUS} becomes the datasource chosen at import; provisioned, it names none and Grafana
    # selects the Prometheus datasource it has (the default).
    return Template(name="datasource", label="Data source", type="datasource", query="prometheus",
                    default="${DS_PROMETHEUS}", refresh=1)


def variable(name: str, label: str, query: str) -> Template:
    return Template(name=name, label=label, query=query, dataSource=DATASOURCE, includeAll=True, multi=True,
                    default="$__all", allValue=".*", refresh=2, sort=1)


def host_and_gpu_variables() -> list[Template]:
    return [datasource_variable(), variable("host", "Host", f"label_values({{{GPU_SERIES}}}, instance)"),
            variable("gpu", "GPU", f'label_values({{{GPU_SERIES}, instance=~"$host"}}, gpu)')]


def explained(description: str, empty: str) -> str:
    return f"{description} Empty when: {empty}".strip()


def table(title: str, empty: str, description: str = "", **kw) -> Table:
    """A table panel; `empty`: why it can have no rows (in its description and its no-data text)."""
    return Table(title=title, dataSource=DATASOURCE, description=explained(description, empty),
                 extraJson={"fieldConfig": {"defaults": {"noValue": empty}}}, **kw)


def target(expr: str, legend: str = "", ref: str = "A", instant: bool = False, table: bool = False) -> Target:
    return Target(expr=expr, legendFormat=legend, refId=ref, instant=instant, datasource=DATASOURCE,
                  format="table" if table else "time_series")


def timeseries(title: str, targets, pos: tuple[int, int, int, int], unit: str = "percentunit",
               description: str = "", ratio: bool = True, empty: str = "", **kw) -> TimeSeries:
    """A time series panel; `empty`: why it can have no data (in its description and its no-data text)."""
    extra = {"fieldConfig": {"defaults": {"min": 0, "max": 1}}} if ratio else {}
    if empty:
        extra = {"fieldConfig": {"defaults": {**extra.get("fieldConfig", {}).get("defaults", {}), "noValue": empty}}}
        description = explained(description, empty)
    return TimeSeries(title=title, description=description, dataSource=DATASOURCE, unit=unit,
                      targets=[target(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(targets)],
                      gridPos=GridPos(h=pos[0], w=pos[1], x=pos[2], y=pos[3]), extraJson=extra or None, **kw)


def queries(dashboard: dict) -> list[tuple[str, str]]:
    """(panel title, expr) of every panel target, rows included: what the stack test runs."""
    found = []

    def walk(panels):
        for panel in panels:
            for t in panel.get("targets", []):
                if t.get("expr"):
                    found.append((panel.get("title", ""), t["expr"]))
            walk(panel.get("panels", []))

    walk(dashboard.get("panels", []))
    for template in dashboard.get("templating", {}).get("list", []):
        query = template.get("query")
        if isinstance(query, str) and query.startswith("label_values("):
            found.append((f"variable {template['name']}", query))
    return found
