"""grafanalib dashboards; `python -m dashboards` writes their JSON to dashboards/generated/."""
