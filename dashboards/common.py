"""What the dashboards share: the provisioned datasource, template variables, panel helpers."""
from __future__ import annotations

from grafanalib.core import GridPos, Target, Template, TimeSeries

# The uid the provisioned datasource has (deploy/grafana/provisioning/datasources/prometheus.yaml).
DATASOURCE = {"type": "prometheus", "uid": "prometheus"}
GPU_SELECTOR = 'instance=~"$host", gpu=~"$gpu"'


def variable(name: str, label: str, query: str) -> Template:
    return Template(name=name, label=label, query=query, dataSource=DATASOURCE, includeAll=True, multi=True,
                    default="$__all", allValue=".*", refresh=2, sort=1)


def host_and_gpu_variables() -> list[Template]:
    return [variable("host", "Host", "label_values(gpu_time_utilization_ratio, instance)"),
            variable("gpu", "GPU", 'label_values(gpu_time_utilization_ratio{instance=~"$host"}, gpu)')]


def target(expr: str, legend: str = "", ref: str = "A", instant: bool = False, table: bool = False) -> Target:
    return Target(expr=expr, legendFormat=legend, refId=ref, instant=instant, datasource=DATASOURCE,
                  format="table" if table else "time_series")


def timeseries(title: str, targets, pos: tuple[int, int, int, int], unit: str = "percentunit",
               description: str = "", ratio: bool = True, **kw) -> TimeSeries:
    extra = {"fieldConfig": {"defaults": {"min": 0, "max": 1}}} if ratio else {}
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
