"""POST /api/v1/nsys and /api/v1/diagnose: exports uploaded over HTTP, validated before they are kept.

An upload lands in the spool directory the nsys source watches (exporter/samplers/nsys.py); a diagnosis
is answered and nothing is kept. The spool's retention is exporter/spool.py.
"""
from __future__ import annotations

import asyncio
import hmac
import logging
import os
import tempfile
import time
import uuid as uuidlib
from pathlib import Path

from exporter.nsys_exports import READ_BUDGET_S, read_export, windows_of
from exporter.snapshot import loggable

log = logging.getLogger(__name__)
UPLOAD_IDLE_S = 10.0  # an upload that sends nothing for this long is abandoned
UPLOAD_DEADLINE_S = 600.0  # and one that takes longer than this in all (a 512 MB export at 1 MB/s)
MAX_IN_FLIGHT = 4  # uploads and diagnoses received or read at once; more wait for a 503's Retry-After


class _Refused(Exception):
    """An upload that ends with this status and one line why (None: the client left, no answer)."""

    def __init__(self, status: int | None, why: str = ""):
        super().__init__(why)
        self.status = status


class UploadSpool:
    """POST /api/v1/nsys: a bearer-token upload of an export into the spool directory the nsys source
    watches. The body streams to a partial file (never past the size limit, never idle for long), is
    read the way the nsys source will publish it (in a worker thread, under a time budget, stopped
    when the client leaves), and only then renamed to a name the server chooses. POST
    /api/v1/diagnose (`diagnose`): the same, answered with nsys_ingest's diagnosis, nothing kept."""

    def __init__(self, token: str, spool_dir: Path, max_bytes: int, retention=None, window_s: float = 5.0,
                 budget_s: float = READ_BUDGET_S, idle_s: float = UPLOAD_IDLE_S, max_in_flight: int = MAX_IN_FLIGHT,
                 refuse_uploads: str | None = None):
        self.token = token
        self.refuse_uploads = refuse_uploads  # why a stored upload would never be published (409), or None
        self.spool_dir = Path(spool_dir)
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.retention = retention  # exporter.spool.SpoolRetention, applied after each upload too
        self.window_s = window_s
        self.budget_s = budget_s
        self.idle_s = idle_s
        self.max_in_flight = max_in_flight
        self._in_flight = 0

    # -- the two endpoints (Starlette requests in, Starlette responses out) -------------------------
    async def handle(self, request):
        """POST /api/v1/nsys: 201 with what was stored, or 400/401/408/409/413/422/503 with one line why."""
        from starlette.responses import JSONResponse

        async def store(part, size):
            if self.refuse_uploads:  # after the body: every client reads the answer, none a broken pipe
                log.info("nsys upload: refused (%d bytes): --replay publishes no other export", size)
                raise _Refused(409, self.refuse_uploads)
            summary = await self._read(request, self._check, part)
            name = f"upload-{time.strftime('%Y%m%dT%H%M%S')}-{uuidlib.uuid4().hex[:8]}.sqlite"
            os.replace(part, self.spool_dir / name)
            if self.retention is not None:
                await asyncio.to_thread(self.retention.tick)
            log.info("nsys upload: stored %s (%d bytes, GPUs %s)", name, size, loggable(", ".join(summary["gpus"])))
            return JSONResponse({"stored": name, "bytes": size, **summary}, status_code=201)

        return await self._with_body(request, store)

    async def diagnose(self, request):
        """POST /api/v1/diagnose: the JSON of `python3 -m nsys_ingest diagnose --json FILE` for the
        uploaded export ("file" reads "upload"), under the upload's rules; the file is deleted
        whatever happens."""
        from starlette.responses import JSONResponse

        async def answer(part, _size):
            return JSONResponse(await self._read(request, self._diagnose, part))

        return await self._with_body(request, answer)

    # -- receiving --------------------------------------------------------------------------------
    async def _with_body(self, request, then):
        """Checks the token and the declared size, receives the body into a partial file and runs
        then(partial, size); the partial file is gone afterwards, whatever happened."""
        from starlette.responses import JSONResponse

        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode()):
            return JSONResponse({"error": "missing or wrong bearer token"}, status_code=401)
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > self.max_bytes:
            return JSONResponse({"error": f"export larger than {self.max_bytes} bytes"}, status_code=413)
        if self._in_flight >= self.max_in_flight:
            return JSONResponse({"error": f"{self._in_flight} uploads in progress already: retry later"},
                                status_code=503, headers={"Retry-After": "10"})
        self._in_flight += 1
        fd, part = tempfile.mkstemp(prefix=".upload-", suffix=".part", dir=self.spool_dir)
        try:
            size = await self._receive(request, fd)
            return await then(part, size)
        except _Refused as refused:
            if refused.status is None:
                return JSONResponse({"error": "client left"}, status_code=499)  # nobody reads it
            return JSONResponse({"error": str(refused)}, status_code=refused.status)
        finally:
            self._in_flight -= 1
            Path(part).unlink(missing_ok=True)

    async def _receive(self, request, fd) -> int:
        from starlette.requests import ClientDisconnect

        size = 0
        deadline = time.monotonic() + UPLOAD_DEADLINE_S
        blocks = request.stream().__aiter__()
        with os.fdopen(fd, "wb") as out:
            while True:
                wait = min(self.idle_s, deadline - time.monotonic())
                try:
                    block = await asyncio.wait_for(blocks.__anext__(), timeout=max(wait, 0.001))
                except StopAsyncIteration:
                    return size
                except ClientDisconnect:
                    log.info("nsys upload: the client left after %d bytes; nothing kept", size)
                    raise _Refused(None) from None
                except asyncio.TimeoutError:
                    why = (f"no data for {self.idle_s:g} s" if time.monotonic() < deadline
                           else f"not complete after {UPLOAD_DEADLINE_S:g} s")
                    log.info("nsys upload: abandoned after %d bytes (%s); nothing kept", size, why)
                    raise _Refused(408, f"upload abandoned: {why}") from None
                size += len(block)
                if size > self.max_bytes:
                    raise _Refused(413, f"export larger than {self.max_bytes} bytes")
                out.write(block)

    # -- reading, in a worker thread, stopped when the client leaves --------------------------------
    async def _read(self, request, work, part):
        """work(part, budget) in a worker thread; the event loop (and /metrics) never waits for it."""
        from nsys_ingest.reader import Budget, IngestError

        budget = Budget(self.budget_s)
        worker = asyncio.ensure_future(asyncio.to_thread(work, part, budget))
        watcher = asyncio.ensure_future(_client_left(request))
        try:
            await asyncio.wait({worker, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if not worker.done():
                budget.cancel.set()  # SQLite stops within a few thousand instructions
                log.info("nsys upload: the client left while its export was read; reading stopped, nothing kept")
                await asyncio.wait({worker})
                worker.exception()  # retrieved: it is the "cancelled" the budget raised, nobody's news
                raise _Refused(None)
            return worker.result()
        except IngestError as exc:
            status = 422 if budget.stopped else 400
            raise _Refused(status, str(exc).replace(str(part), "the upload")) from None
        except asyncio.CancelledError:  # the server is stopping: so does the read
            budget.cancel.set()
            raise
        finally:
            watcher.cancel()

    def _check(self, part, budget) -> dict:
        """What the nsys source will publish, read now: an export that would publish nothing is refused."""
        from nsys_ingest.reader import IngestError

        windows, era = read_export(Path(part), lambda e: (windows_of(e, self.window_s), e.era), budget=budget)
        if not windows:
            raise IngestError("the export has GPU metrics but no samples of GR, SM, tensor or DRAM activity: "
                              "profile with --gpu-metrics-devices=all")
        return {"gpus": sorted(windows), "schema": era}

    @staticmethod
    def _diagnose(part, budget) -> dict:
        from nsys_ingest.diagnose import diagnose

        result = read_export(Path(part), diagnose, require_metrics=False, budget=budget)
        return {**result, "file": "upload"}


async def _client_left(request) -> None:
    """Returns when the client of a request whose body was read hangs up."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
