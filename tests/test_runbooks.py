"""Every alert's runbook_url is a real URL that answers: the base is the deployment's external label
runbook_base_url (prometheus.yaml), whose default is the compose stack's runbooks service, served by
deploy/serve_runbooks.py; the rules' fallback (no label) is the same URL, never a repository path."""
from __future__ import annotations

import subprocess
import sys
import urllib.request
from urllib.parse import urlparse

import yaml

from tests.helpers import ROOT, free_port, wait_for

RULES = yaml.safe_load((ROOT / "rules" / "gpu-utilization.rules.yaml").read_text())
ALERTS = [r for g in RULES["groups"] for r in g["rules"] if "alert" in r]


def base_url() -> str:
    return yaml.safe_load((ROOT / "prometheus.yaml").read_text())["global"]["external_labels"]["runbook_base_url"]


def test_the_base_and_the_fallback_are_the_compose_runbooks_service():
    base = urlparse(base_url())
    assert base.scheme == "http" and base.hostname == "localhost"
    compose = yaml.safe_load((ROOT / "docker-compose.yaml").read_text())["services"]["runbooks"]
    assert f"127.0.0.1:{base.port}:8080" in compose["ports"]
    assert "./docs/runbooks:/srv/runbooks:ro" in compose["volumes"]
    for rule in ALERTS:
        assert rule["annotations"]["runbook_url"] == ("{{ with $externalLabels.runbook_base_url }}{{ . }}{{ else }}"
                                                      f"{base_url()}{{{{ end }}}}/{rule['alert']}.md")


def test_the_runbooks_service_serves_every_alerts_runbook_as_text():
    port = free_port()
    server = subprocess.Popen([sys.executable, str(ROOT / "deploy" / "serve_runbooks.py"), str(ROOT / "docs" / "runbooks"),
                               str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        def get(name):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/{name}", timeout=5) as answer:
                return answer.status, answer.headers["Content-Type"], answer.read().decode()

        wait_for(lambda: get("HiddenIdleSMs.md"), 30, 0.2, "the runbooks server")
        for rule in ALERTS:
            status, kind, text = get(f"{rule['alert']}.md")
            assert (status, kind) == (200, "text/plain; charset=utf-8")
            assert text == (ROOT / "docs" / "runbooks" / f"{rule['alert']}.md").read_text()
    finally:
        server.terminate()
        server.wait(10)
