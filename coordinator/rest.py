"""The coordinator's REST API and web UI: routing, authentication, and the HTTP shell around rest_views.

Served by netstack/http.py on `--http-port`, beside the RPC and metrics
ports. Reads are open, like /metrics (run it on a trusted network or behind a
proxy); anything that changes a job (cancel, checkpoint, savepoint, rescale)
needs `Authorization: Bearer <cluster token>`, compared in constant time, and
goes through the very RPC handler the CLI calls (`call`), so the REST API
can do nothing the token's RPCs could not, with the same trust checks on
savepoint directories. A worker's log tail is read open too, as Flink's UI
does; its lines are what the worker logged (no token, no record data). So is a worker's profile (Flink's
flame graphs are too): function names and source lines, sampled for a few seconds, one profile at a time
per worker.

    GET  /                                     the web UI (coordinator/ui/index.html)
    GET  /ui/<file>                            its script and style sheet
    GET  /api/openapi.json                     the OpenAPI document of everything below
    GET  /api/v1/overview                      workers, slots, jobs by state
    GET  /api/v1/jobs                          every job, briefly
    GET  /api/v1/jobs/{id}                     one job
    GET  /api/v1/jobs/{id}/graph               vertices with per-subtask rates and backpressure, edges
    GET  /api/v1/jobs/{id}/checkpoints         checkpoint history with per-task figures (?limit=N, the last N)
    GET  /api/v1/jobs/{id}/restarts            failures and restart times
    GET  /api/v1/jobs/{id}/exceptions          the exception history: causes, tracebacks, the restart each caused
    GET  /api/v1/jobs/{id}/config              what the job was submitted with
    GET  /api/v1/workers                       registered workers with memory, CPU and their metrics links
    GET  /api/v1/workers/{id}                  one worker, its tasks and its log tail (?lines=N)
    GET  /api/v1/workers/{id}/profile          py-spy's stacks of the worker over ?seconds=N (1-30, default 5)
    POST /api/v1/jobs/{id}/cancel              (token) cancel
    POST /api/v1/jobs/{id}/checkpoints         (token) take a checkpoint now; body {"mode"?, "timeout_s"?}
    POST /api/v1/jobs/{id}/savepoints          (token) take a savepoint; body {"directory"?, "timeout_s"?}
    POST /api/v1/jobs/{id}/rescale             (token) body {"parallelism": {NAME or "*": N}, "timeout_s"?}
"""

from __future__ import annotations

import hmac
import json
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coordinator import rest_views as views
from netstack.errors import RpcError
from netstack.http import HttpLimits, HttpRequest, HttpResponse

if TYPE_CHECKING:
    from coordinator.jobs import JobRecord
    from coordinator.registry import WorkerRegistry

UI_DIR = Path(__file__).parent / "ui"
STATIC = {"/": ("index.html", "text/html; charset=utf-8"),
          "/ui/app.js": ("app.js", "text/javascript; charset=utf-8"),
          "/ui/style.css": ("style.css", "text/css; charset=utf-8"),
          "/api/openapi.json": ("openapi.json", "application/json")}

# RPC error types -> HTTP status; anything else is a 409 (the request was fine, the job's state was not)
ERROR_STATUS = {"UnknownJob": 404, "JobNotRunning": 409, "PathNotAllowed": 403, "BadCheckpointRequest": 400,
                "BadRescaleRequest": 400, "BadArgs": 400, "BadRequest": 400,
                "NotLeader": 503,  # a standby coordinator: ask the leader
                "UnknownWorker": 404, "BadProfileRequest": 400,
                "ProfilerUnavailable": 503, "WorkerProfileUnavailable": 503}  # py-spy missing, not permitted

MAX_NUMBER_DIGITS = 18  # a query number longer than this is no count of anything: 400, not int() on 5,000 digits
DEFAULT_HISTORY = 100  # checkpoints per answer unless ?limit= says otherwise (earlier attempts' add up)
LOG_LINES = 200  # a worker's log lines per answer unless ?lines= says otherwise
MAX_LOG_LINES = 1000
PROFILE_SECONDS = 5  # a worker's profile samples this long unless ?seconds= says otherwise

# The REST port's limits: a browser keeps a few connections; mutating calls send small JSON bodies.
REST_LIMITS = HttpLimits(max_connections=64, max_idle=32, idle_timeout_s=10.0, max_body_bytes=64 * 1024)

Call = Callable[[str, dict[str, Any]], Awaitable[Any]]


@dataclass(frozen=True)
class Route:
    method: str
    pattern: re.Pattern[str]
    name: str
    mutating: bool = False


PARAMETER = r"[A-Za-z0-9_.-]+"  # a job or worker id: no slash, so no path tricks


def _route(method: str, path: str, name: str, mutating: bool = False) -> Route:
    pattern = re.sub(r"\{(\w+)\}", lambda m: f"(?P<{m.group(1)}>{PARAMETER})", path)
    return Route(method, re.compile(f"^{pattern}$"), name, mutating)


def path_of(route: Route) -> str:
    """The route's path as the OpenAPI document writes it ({job_id}, {worker_id})."""
    return re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", route.pattern.pattern[1:-1])


ROUTES = (
    _route("GET", "/api/v1/overview", "overview"),
    _route("GET", "/api/v1/jobs", "jobs"),
    _route("GET", "/api/v1/jobs/{job_id}", "job"),
    _route("GET", "/api/v1/jobs/{job_id}/graph", "graph"),
    _route("GET", "/api/v1/jobs/{job_id}/checkpoints", "checkpoints"),
    _route("GET", "/api/v1/jobs/{job_id}/restarts", "restarts"),
    _route("GET", "/api/v1/jobs/{job_id}/exceptions", "exceptions"),
    _route("GET", "/api/v1/jobs/{job_id}/config", "config"),
    _route("GET", "/api/v1/workers", "workers"),
    _route("GET", "/api/v1/workers/{worker_id}", "worker"),
    _route("GET", "/api/v1/workers/{worker_id}/profile", "profile"),
    _route("POST", "/api/v1/jobs/{job_id}/cancel", "cancel", mutating=True),
    _route("POST", "/api/v1/jobs/{job_id}/checkpoints", "checkpoint", mutating=True),
    _route("POST", "/api/v1/jobs/{job_id}/savepoints", "savepoint", mutating=True),
    _route("POST", "/api/v1/jobs/{job_id}/rescale", "rescale", mutating=True),
)


def match(method: str, path: str) -> tuple[Route | None, dict[str, str], bool]:
    """(the route, its path parameters, whether the path exists under another method)."""
    other_method = False
    for route in ROUTES:
        m = route.pattern.match(path)
        if m is None:
            continue
        if route.method == method or (method == "HEAD" and route.method == "GET"):
            return route, m.groupdict(), False
        other_method = True
    return None, {}, other_method


def authorized(headers: Mapping[str, str], token: str) -> bool:
    """`Authorization: Bearer <token>`, compared in constant time (as the RPC handshake does)."""
    scheme, _, given = headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


def json_response(status: int, body: Any, *extra: tuple[str, str]) -> HttpResponse:
    return HttpResponse(status, json.dumps(body, separators=(",", ":")).encode(), "application/json",
                        (("Cache-Control", "no-store"), *extra))


def error(status: int, message: str, kind: str) -> HttpResponse:
    extra = (("WWW-Authenticate", 'Bearer realm="sluice"'),) if status == 401 else ()
    return json_response(status, {"error": message, "type": kind}, *extra)



def whole_number(text: str) -> int | None:
    """A query parameter's ASCII digits as an int, or None: `str.isdigit` alone also passes a superscript two
    (which `int` refuses) and a 5,000-digit number (which `int` refuses past its digit limit)."""
    if not (text.isascii() and text.isdigit()) or len(text) > MAX_NUMBER_DIGITS:
        return None
    return int(text)


class RestApi:
    """The handler netstack/http.py calls for every request on the REST port."""

    def __init__(self, *, jobs: Callable[[], Mapping[str, JobRecord]], workers: WorkerRegistry, token: str, call: Call,
                 clock: Callable[[], float] = time.monotonic, wall_clock: Callable[[], float] = time.time,
                 scheme: str = "http") -> None:
        self._jobs = jobs  # read at every request: the job table may be replaced (a recovered coordinator)
        self.workers = workers
        self.token = token
        self.call = call  # (rpc method, args) -> the coordinator's own RPC handler's answer
        self.clock = clock
        self.wall_clock = wall_clock
        self.scheme = scheme  # of the metrics URLs it gives: "https" when the cluster runs TLS
        self._static: dict[str, bytes] = {}

    async def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path in STATIC and request.method in ("GET", "HEAD"):
            return self._serve_static(request.path)
        route, params, other_method = match(request.method, request.path)
        if route is None:
            if other_method:
                return error(405, f"{request.method} is not allowed on {request.path}", "MethodNotAllowed")
            return error(404, f"no such resource: {request.path}", "NotFound")
        if route.mutating:
            if not authorized(request.headers, self.token):
                return error(401, "this call needs the cluster token: Authorization: Bearer <token>", "Unauthorized")
            try:
                body = json.loads(request.body or b"{}")
            except ValueError as exc:
                return error(400, f"the body is not JSON: {exc}", "BadRequest")
            if not isinstance(body, dict):
                return error(400, "the body must be a JSON object", "BadRequest")
            return await self._mutate(route.name, params["job_id"], body)
        limit = whole_number(request.query.get("limit", str(DEFAULT_HISTORY)))
        if limit is None or limit < 1:
            return error(400, f"limit must be a positive whole number, got {request.query['limit'][:40]!r}",
                         "BadRequest")
        if route.name == "worker":
            lines = whole_number(request.query.get("lines", str(LOG_LINES)))
            if lines is None or not 0 <= lines <= MAX_LOG_LINES:
                return error(400, f"lines must be a whole number up to {MAX_LOG_LINES}, got "
                                  f"{request.query['lines'][:40]!r}", "BadRequest")
            return await self._worker(params["worker_id"], lines)
        if route.name == "profile":
            seconds = whole_number(request.query.get("seconds", str(PROFILE_SECONDS)))
            if seconds is None:
                return error(400, f"seconds must be a whole number, got {request.query['seconds'][:40]!r}",
                             "BadRequest")
            return await self._profile(params["worker_id"], seconds)
        return self._read(route.name, params.get("job_id"), limit)

    def _serve_static(self, path: str) -> HttpResponse:
        name, content_type = STATIC[path]
        if name not in self._static:
            self._static[name] = (UI_DIR / name).read_bytes()  # small files, read once
        return HttpResponse(200, self._static[name], content_type, (("Cache-Control", "no-cache"),))

    @property
    def jobs(self) -> Mapping[str, JobRecord]:
        return self._jobs()

    def _read(self, name: str, job_id: str | None, limit: int) -> HttpResponse:
        if name == "overview":
            states: dict[str, int] = {}
            for j in self.jobs.values():
                states[j.state] = states.get(j.state, 0) + 1
            return json_response(200, {"workers": len(self.workers),
                                       "slots_total": sum(w.slots for w in self.workers.values()),
                                       "jobs": states})
        if name == "jobs":
            return json_response(200, {"jobs": [views.job_brief(j) for j in self.jobs.values()]})
        if name == "workers":
            now = self.clock()
            return json_response(200, {"workers": [
                views.worker_view(w, now, len(views.tasks_on(self.jobs.values(), w.worker_id)), self.scheme)
                for w in self.workers.values()]})
        job = self.jobs.get(job_id or "")
        if job is None:
            return error(404, f"no job {job_id}", "UnknownJob")
        if name == "job":
            return json_response(200, views.job_detail(job))
        offset = self.wall_clock() - self.clock()
        if name == "graph":
            return json_response(200, views.job_graph(job, offset))
        if name == "restarts":
            return json_response(200, views.restarts_view(job))
        if name == "exceptions":
            return json_response(200, views.exceptions_view(job, limit))
        if name == "config":
            return json_response(200, views.config_view(job))
        assert name == "checkpoints"
        figures = job.checkpoints.coordinator.task_figures() if job.checkpoints is not None else {}
        history = job.checkpoint_history()[-limit:]
        return json_response(200, views.checkpoints_view(job, history, figures, offset))

    async def _worker(self, worker_id: str, lines: int) -> HttpResponse:
        """One worker: its figures, the tasks it runs, and its log tail (asked of the worker itself)."""
        w = self.workers.get(worker_id)
        if w is None:
            return error(404, f"no worker {worker_id}", "UnknownWorker")
        tasks = views.tasks_on(self.jobs.values(), worker_id)
        log: list[str] = []
        log_error = ""
        if lines:
            try:
                log = list((await self.call("worker_log", {"worker_id": worker_id, "lines": lines}))["lines"])
            except RpcError as exc:  # the page shows the figures all the same, and why there is no log
                log_error = str(exc)
        return json_response(200, {**views.worker_view(w, self.clock(), len(tasks), self.scheme), "task_list": tasks,
                                   "log": log, "log_error": log_error})

    async def _profile(self, worker_id: str, seconds: int) -> HttpResponse:
        """The worker's stacks over `seconds`, for a flame graph; a refusal is one line (`error`) with its type."""
        try:
            result = await self.call("worker_profile", {"worker_id": worker_id, "seconds": seconds})
        except RpcError as exc:
            return error(ERROR_STATUS.get(exc.remote_type, 409), str(exc), exc.remote_type)
        return json_response(200, views.profile_view(result))

    async def _mutate(self, name: str, job_id: str, body: dict[str, Any]) -> HttpResponse:
        args: dict[str, Any] = {"job_id": job_id}
        if "timeout_s" in body:
            args["timeout_s"] = body["timeout_s"]
        if name == "checkpoint" and body.get("mode") is not None:
            args["mode"] = body["mode"]
        if name == "savepoint":
            args["savepoint"] = True
            args["directory"] = body.get("directory")
        if name == "rescale":
            args["parallelism"] = body.get("parallelism")
        method = {"cancel": "cancel", "checkpoint": "checkpoint", "savepoint": "checkpoint", "rescale": "rescale"}
        try:
            result = await self.call(method[name], args)
        except RpcError as exc:
            return error(ERROR_STATUS.get(exc.remote_type, 409), str(exc), exc.remote_type)
        except (TypeError, ValueError) as exc:  # e.g. a timeout_s that is not a number
            return error(400, f"bad arguments: {exc}", "BadRequest")
        except TimeoutError:
            return error(504, "the call did not finish within its timeout_s; it may still complete", "Timeout")
        return json_response(200, result)
