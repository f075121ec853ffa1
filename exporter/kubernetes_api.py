"""A small, bounded reader of the Kubernetes API server: the ResourceSlices of NVIDIA's DRA driver
(device uuid attributes and capacities) and the ResourceClaims of shared devices (consumed capacity),
resource.k8s.io/v1. The kubelet sampler asks it at most once per tick, within a time budget.

--kubernetes-api auto: in a pod, the in-cluster service account (token and CA under
/var/run/secrets/kubernetes.io/serviceaccount, KUBERNETES_SERVICE_HOST/PORT); off; or a URL (e.g.
`kubectl proxy`'s http://127.0.0.1:8001). RBAC: get and list resourceclaims and resourceslices.
Every answer is hostile until checked (hostio/answers.py): a deadline over each whole request
and a budget per tick, a size cap per answer and a cap on the values its JSON parses into, an item
cap per list; anything that goes wrong reading or parsing it (a quantity no number holds, JSON nested
too deep) is this reader's error: one log line per problem, success 0, a back-off.
"""
from __future__ import annotations

import logging
import os
import re
import ssl
import time
import urllib.parse
from dataclasses import dataclass

from hostio import answers
from exporter.samplers.dra import CAPACITY_NAMES, NVIDIA_DRIVER, ApiView
from exporter.snapshot import CollectorHealth, LogOnce

log = logging.getLogger(__name__)
SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
GROUP = "/apis/resource.k8s.io/v1"
TIMEOUT_S = 2.0
BUDGET_S = 3.0  # API time one kubelet tick may spend
MAX_ANSWER_BYTES = 8 * 1024 * 1024
# Objects one answer's JSON may parse into (a page of 200 ResourceSlices of 8 GPUs each is about 80,000):
# 8 MB of `[{},{},...]` would otherwise be 2.8 million dicts, some 200 MB.
MAX_ANSWER_VALUES = 200_000
PAGE = 200  # ResourceSlices per list page
MAX_SLICE_PAGES = 10
# Devices kept from one list of slices, whatever its pages hold (a page under the caps above may name
# 60,000 devices: ten such pages kept took the exporter from 70 to 386 MB). A node of 8 GPUs publishes a
# few hundred with every MIG placement; without NODE_NAME this is some 30 such nodes' worth.
MAX_SLICE_DEVICES = 8192
MAX_CLAIM_GETS = 32  # claims fetched per tick; the rest on the next ones
SLICES_EVERY_S = 60.0
BACKOFF_S = 30.0
FORGET_AFTER_S = 600.0  # device uuids and capacities not confirmed for this long are dropped
QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|[kMGTPE]|m|u|n|[eE][+-]?[0-9]{1,2})?$")
UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60, "k": 1e3, "M": 1e6,
         "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18, "m": 1e-3, "u": 1e-6, "n": 1e-9, None: 1}


def quantity(text) -> float | None:
    """A Kubernetes resource quantity ("80Gi", "4", "500m", "1e3") as a number; None if it is none."""
    if not isinstance(text, str) or len(text) > 64:
        return None
    m = QUANTITY.match(text.strip())
    if not m:
        return None
    suffix = m.group(2)
    return float(m.group(1)) * (UNITS[suffix] if suffix in UNITS else 10.0 ** int(suffix[1:]))  # "E": exa; "e3": 10^3


class ApiError(answers.AnswerError):
    """Why the API server's answer was not used (its `kind` keys one log line per problem)."""


@dataclass(frozen=True)
class Endpoint:
    url: str  # scheme://host:port
    token_file: str | None
    ca_file: str | None


def endpoint(mode: str, environ=os.environ, service_account: str = SERVICE_ACCOUNT) -> Endpoint | None:
    """Where the API server is for --kubernetes-api auto|off|URL; None: off, or auto outside a pod."""
    if mode == "off":
        return None
    token = os.path.join(service_account, "token")
    ca = os.path.join(service_account, "ca.crt")
    if mode == "auto":
        host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host or not os.path.exists(token):
            return None
        host = f"[{host}]" if ":" in host else host
        return Endpoint(f"https://{host}:{port}", token, ca if os.path.exists(ca) else None)
    return Endpoint(mode.rstrip("/"), token if os.path.exists(token) else None, ca if os.path.exists(ca) else None)


class KubernetesApi:
    """The API views the kubelet sampler needs, refreshed within a budget, never frozen."""

    name = "kubernetes_api"

    def __init__(self, where: Endpoint, node_name: str | None = None, timeout: float = TIMEOUT_S,
                 budget: float = BUDGET_S):
        self.where = where
        self.node_name = node_name
        self.timeout = timeout
        self.budget = budget
        self.health = CollectorHealth(False, 0.0, "not read yet")
        self._log = LogOnce(log)
        parsed = urllib.parse.urlsplit(where.url)
        self._https = parsed.scheme == "https"
        self._host, self._port = parsed.hostname or "127.0.0.1", parsed.port or (443 if self._https else 80)
        self._ssl = None  # TLS, verified against the service account's CA (else the system's)
        if self._https:
            self._ssl = ssl.create_default_context(cafile=where.ca_file) if where.ca_file else \
                ssl.create_default_context()
        self._uuids: dict[tuple[str, str], str] = {}
        self._capacity: dict[tuple[str, str], dict[str, float]] = {}
        self._slices_at = float("-inf")  # monotonic time of the last good slice list
        self._slices_tried = float("-inf")
        # (namespace, name) -> (monotonic time read, consumed capacity per (pool, device, share_id))
        self._claims: dict[tuple[str, str], tuple[float, dict]] = {}
        self._failed_at = float("-inf")

    # -- one bounded request --------------------------------------------------------------------
    def _token(self) -> str | None:
        if not self.where.token_file:
            return None
        try:
            with open(self.where.token_file, "rb") as f:  # re-read: projected tokens rotate
                return f.read(16384).decode("ascii", "replace").strip() or None
        except OSError:
            return None

    def get(self, path: str, deadline: float) -> dict:
        """The JSON object at `path`, read by the earlier of the tick's deadline and this request's own."""
        if deadline <= time.monotonic():
            raise ApiError("time budget of this tick spent", "budget")
        headers = {"Accept": "application/json"}
        token = self._token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        try:
            answer = answers.get(self._host, self._port, path, min(deadline, time.monotonic() + self.timeout),
                                      MAX_ANSWER_BYTES, headers, self._ssl)
            if answer.status == 404:
                raise ApiError(f"GET {path[:120]}: 404", "404")
            if answer.status != 200:
                hint = " (RBAC: the exporter's service account needs get and list on resourceclaims and " \
                       "resourceslices of resource.k8s.io)" if answer.status in (401, 403) else ""
                raise ApiError(f"GET {path[:120]}: HTTP {answer.status}{hint}", str(answer.status))
            data = answers.parse_json(answer.body, MAX_ANSWER_VALUES)
        except answers.AnswerError as exc:
            raise ApiError(f"GET {path[:120]}: {exc}", exc.kind) from None
        except OSError as exc:
            raise ApiError(f"GET {path[:120]}: {type(exc).__name__}: {str(exc)[:200]}", type(exc).__name__) from None
        if not isinstance(data, dict):
            raise ApiError(f"GET {path[:120]}: not a JSON object", "json")
        return data

    # -- what the kubelet sampler asks for ------------------------------------------------------
    def view(self, devices: set[tuple[str, str]], shared: set[tuple[str, str, str, str, str]]) -> ApiView:
        """Refreshes what is due within the budget and returns what is known now. `devices`: (pool,
        device) listed by the kubelet; `shared`: (namespace, claim, pool, device, share_id) of the
        allocations of shared devices. A claim's allocation never changes; a claim is read again only
        when it lacks an allocation listed now (deleted and made again), at most every BACKOFF_S."""
        started = time.monotonic()
        deadline = started + self.budget
        wanted: dict[tuple[str, str], set] = {}
        for namespace, name, *allocation in shared:
            wanted.setdefault((namespace, name), set()).add(tuple(allocation))
        self._claims = {k: v for k, v in self._claims.items() if k in wanted}  # gone claims go
        stale = [k for k in sorted(wanted) if k not in self._claims or
                 (not wanted[k] <= self._claims[k][1].keys() and started - self._claims[k][0] >= BACKOFF_S)]
        if started - self._failed_at >= BACKOFF_S and (devices or shared):
            try:
                unknown = any(d not in self._uuids for d in devices)
                due = started - self._slices_at >= SLICES_EVERY_S
                if due or (unknown and started - self._slices_tried >= SLICES_EVERY_S / 6):
                    self._slices_tried = started
                    self._read_slices(deadline)
                for key in stale[:MAX_CLAIM_GETS]:
                    self._read_claim(key, wanted[key], deadline)
                self._log.clear("kubernetes api", "the API server answers again")
                self.health = CollectorHealth(True, time.monotonic() - started, "")
            except Exception as exc:  # noqa: BLE001 - whatever an answer makes go wrong is this reader's error
                self._failed_at = time.monotonic()
                what = str(exc) if isinstance(exc, ApiError) else f"reading its answer: {type(exc).__name__}: {exc}"
                why = f"{what[:300]} (shared DRA devices are split evenly; retried in {BACKOFF_S:.0f} s)"
                self._log.problem("kubernetes api", why, kind=getattr(exc, "kind", type(exc).__name__))
                self.health = CollectorHealth(False, time.monotonic() - started, why)
        if started - self._slices_at > FORGET_AFTER_S:
            self._uuids, self._capacity = {}, {}
        consumed = {}
        for (namespace, name), (_, results) in self._claims.items():
            for (pool, device, share), amounts in results.items():
                consumed[(namespace, name, pool, device, share)] = amounts
        return ApiView(dict(self._uuids), dict(self._capacity), consumed)

    def _read_slices(self, deadline: float) -> None:
        selector = f"spec.driver={NVIDIA_DRIVER}" + (f",spec.nodeName={self.node_name}" if self.node_name else "")
        uuids, capacity, token = {}, {}, ""
        kept, left_out = set(), 0
        for _ in range(MAX_SLICE_PAGES):
            query = {"fieldSelector": selector, "limit": str(PAGE), **({"continue": token} if token else {})}
            data = self.get(f"{GROUP}/resourceslices?{urllib.parse.urlencode(query)}", deadline)
            for item in _list(data.get("items"))[:PAGE]:
                spec = _dict(_dict(item).get("spec"))
                if spec.get("driver") != NVIDIA_DRIVER:
                    continue
                pool = _dict(spec.get("pool")).get("name")
                for device in _list(spec.get("devices"))[:1024]:
                    device = _dict(device)
                    name = device.get("name")
                    if not isinstance(pool, str) or not isinstance(name, str):
                        continue
                    if (pool, name) not in kept and len(kept) == MAX_SLICE_DEVICES:
                        left_out += 1
                        continue
                    kept.add((pool, name))
                    attrs = _dict(device.get("attributes"))
                    uuid = _dict(attrs.get("uuid") or attrs.get(f"{NVIDIA_DRIVER}/uuid")).get("string")
                    if isinstance(uuid, str) and len(uuid) < 128:
                        uuids[(pool, name)] = uuid
                    capacity[(pool, name)] = capacities(_dict(device.get("capacity")), lambda v: _dict(v).get("value"))
            token = _dict(data.get("metadata")).get("continue") or ""
            if not isinstance(token, str) or not token:
                break
        else:
            self._log.problem("kubernetes api slices", f"more than {MAX_SLICE_PAGES * PAGE} ResourceSlices of "
                              f"{NVIDIA_DRIVER}: the rest are not read (set NODE_NAME to list this node's only)")
        if left_out:
            self._log.problem("kubernetes api slice devices", f"the ResourceSlices of {NVIDIA_DRIVER} list more than "
                              f"{MAX_SLICE_DEVICES} devices: only the first {MAX_SLICE_DEVICES} are read (set "
                              "NODE_NAME to list this node's only)")
        else:
            self._log.clear("kubernetes api slice devices", f"at most {MAX_SLICE_DEVICES} devices listed again")
        self._uuids, self._capacity = uuids, capacity
        self._slices_at = time.monotonic()

    def _read_claim(self, key: tuple[str, str], listed: set[tuple[str, str, str]], deadline: float) -> None:
        """The consumed capacity of the claim's allocations the kubelet lists (`listed`: (pool, device,
        share_id)): what the claim says of others is never kept, so all claims keep no more than the
        kubelet's MAX_DEVICES allocations."""
        namespace, name = (urllib.parse.quote(k, safe="") for k in key)
        try:
            data = self.get(f"{GROUP}/namespaces/{namespace}/resourceclaims/{name}", deadline)
        except ApiError as exc:
            if exc.kind == "404":  # deleted meanwhile: nothing to know about it
                self._claims[key] = (time.monotonic(), {})
                return
            raise
        results = {}
        allocation = _dict(_dict(data.get("status")).get("allocation"))
        for result in _list(_dict(allocation.get("devices")).get("results"))[:256]:
            result = _dict(result)
            if result.get("driver") != NVIDIA_DRIVER:
                continue
            allocation = (str(result.get("pool")), str(result.get("device")), str(result.get("shareID") or ""))
            if allocation in listed:
                results[allocation] = capacities(_dict(result.get("consumedCapacity")), lambda v: v)
        self._claims[key] = (time.monotonic(), results)


def capacities(named: dict, value_of) -> dict[str, float]:
    """Of a device's capacities or an allocation's consumed capacity, the CAPACITY_NAMES a share is
    computed by, as numbers (`value_of` finds the quantity in each): no other name is kept."""
    amounts = {name: quantity(value_of(named.get(name))) for name in CAPACITY_NAMES}
    return {name: amount for name, amount in amounts.items() if amount}


def _dict(value) -> dict:
    return value if isinstance(value, dict) else {}


def _list(value) -> list:
    return value if isinstance(value, list) else []


def build(args) -> KubernetesApi | None:
    where = endpoint(args.kubernetes_api)
    if where is None:
        return None
    log.info("DRA claim details from the Kubernetes API at %s", where.url)
    return KubernetesApi(where, node_name=os.environ.get("NODE_NAME") or None)
