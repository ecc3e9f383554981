"""The console's Starlette application: server-rendered pages (Jinja2, autoescaped) and, with
--allow-actions, four actions behind authentication and a CSRF check."""

from __future__ import annotations

import contextlib
import logging
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import quote
from collections.abc import AsyncIterator, Callable
from typing import Any

import jinja2
import psycopg
from psycopg_pool import PoolTimeout
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .. import dsn as dsns
from ..client import operations
from ..client.keys import describe_limits
from ..client.status import STATES
from ..names import QUEUE_PATTERN
from . import auth, data
from .cluster import ClusterReader

HERE = Path(__file__).resolve().parent
log = logging.getLogger("queueworker.console")
QUEUE_NAME = re.compile(QUEUE_PATTERN)
MAX_FORM_BYTES = 4096
# What a successful action's redirect may announce: fixed sentences, never text from the request.
PAST = {"retry": "retried", "cancel": "cancelled", "pause": "paused", "resume": "resumed"}
DONE = {"retried": "The task is pending again.", "cancelled": "The task was cancelled.",
        "paused": "The queue is paused until resumed.", "resumed": "The queue was resumed."}


@dataclass(frozen=True)
class ConsoleConfig:
    dsn: str
    token: str | None = None        # None: read-only and open
    allow_actions: bool = False
    kubeconfig: str | None = None   # None: in-cluster configuration, when there is one
    namespaces: tuple[str, ...] = ()  # the QueueWorkers of these namespaces only; empty: every namespace
    # Host names a request may give besides localhost and IP addresses (auth.served): others are
    # refused, so no page is read through a name an attacker controls (DNS rebinding).
    allowed_hosts: frozenset[str] = frozenset()
    secure_cookies: bool = False    # the CSRF cookie is Secure on every response, not only over TLS

    def __post_init__(self) -> None:
        if self.allow_actions and not self.token:
            raise auth.CredentialsError(
                f"--allow-actions needs credentials: set ${auth.TOKEN_ENV} or ${auth.TOKEN_FILE_ENV} "
                "(or --token-file) to a token")


class BadRequest(ValueError):
    """A query parameter or form field that cannot be used; the message says which."""


class ActionRefused(Exception):
    """An action the database would not do (the task is in the wrong state, ...)."""


def _text(value: str | None, label: str, limit: int) -> str | None:
    if value is None or value == "":
        return None
    if len(value) > limit or "\x00" in value:
        raise BadRequest(f"{label} must be at most {limit} characters, without NUL")
    return value


def _queue(value: str | None) -> str | None:
    if value in (None, ""):
        return None
    if QUEUE_NAME.fullmatch(value) is None:
        raise BadRequest("not a queue name (letters, digits and _.:- , at most 128)")
    return value


def _id(value: str | None, label: str) -> int | None:
    if value in (None, ""):
        return None
    if not value.isascii() or not value.isdigit() or not 1 <= int(value) <= data.BIGINT_MAX:
        raise BadRequest(f"{label} must be a whole number from 1 to {data.BIGINT_MAX}")
    return int(value)


def _age(moment: Any) -> str:
    if not isinstance(moment, datetime):
        return ""
    seconds = (datetime.now(timezone.utc) - moment).total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if abs(seconds) >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.1f}s"


def _seconds(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}s"


def _segment(value: object) -> str:
    """A value as one path segment: every reserved character quoted, `/` included, so no stored
    name can make a link or a form address another path (`evil/../q2` is not `q2`)."""
    return quote(str(value), safe="")


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined)
    env.filters.update(age=_age, seconds=_seconds, key_limits=describe_limits, progress=data.progress, show_json=data.show_json,
                       segment=_segment)
    env.globals.update(STATES=STATES, DEPTH_CAP=data.DEPTH_CAP)
    return env


class Console:
    """The pages and actions, with what they share: the database, the cluster reader, the signer."""

    def __init__(self, config: ConsoleConfig):
        self.config = config
        self.db = data.ConsoleDatabase(config.dsn)
        self.cluster = ClusterReader(config.kubeconfig, config.namespaces)
        self.signer = auth.CsrfSigner(config.token)
        self.templates = _environment()

    def secrets(self) -> list[str | None]:
        return [self.config.dsn, dsns.parse(self.config.dsn).get("password"), self.config.token]

    def render(self, request: Request, template: str, status_code: int = 200, **context: Any) -> HTMLResponse:
        cookie = request.state.csrf_cookie
        page = self.templates.get_template(template).render(
            request=request, actions=self.config.allow_actions, csrf_token=self.signer.sign(cookie),
            done=DONE.get(request.query_params.get("done", "")), **context)
        return HTMLResponse(page, status_code=status_code)

    def error(self, request: Request, status_code: int, message: str) -> HTMLResponse:
        return self.render(request, "error.html", status_code=status_code, message=message)

    # -- pages ---------------------------------------------------------------------------------

    def queues(self, request: Request) -> Response:
        return self.render(request, "queues.html", queues=self.db.queues(), window=data.RATE_WINDOW_SECONDS)

    def tasks(self, request: Request) -> Response:
        params = request.query_params
        task_id = _id(params.get("id"), "the task id")
        if task_id is not None:
            return RedirectResponse(f"/tasks/{task_id}", status_code=303)
        state = params.get("state") or None
        if state is not None and state not in STATES:
            raise BadRequest(f"the state must be one of {', '.join(STATES)}")
        filters = {"queue": _queue(params.get("queue")), "state": state,
                   "task": _text(params.get("task"), "the task name", 200),
                   "dedupe_key": _text(params.get("key"), "the dedupe key", 512)}
        page = self.db.tasks(before=_id(params.get("before"), "before"), **filters)
        shown = {("key" if k == "dedupe_key" else k): v for k, v in filters.items() if v is not None}
        return self.render(request, "tasks.html", page=page, filters=shown, scan_budget=data.SCAN_BUDGET)

    def task(self, request: Request) -> Response:
        task_id = _id(request.path_params["task_id"], "the task id")
        task, events = self.db.task(task_id)
        if task is None:
            return self.error(request, 404, f"no task with id {task_id}")
        return self.render(request, "task.html", task=task, events=events, events_shown=data.EVENTS_SHOWN,
                           retryable=task.state in ("failed", "cancelled"),
                           cancellable=task.state in operations.CANCELLABLE)

    def workers(self, request: Request) -> Response:
        workers, leases = self.db.workers()
        return self.render(request, "workers.html", workers=workers, leases=leases)

    def runs(self, request: Request) -> Response:
        name = _text(request.query_params.get("name"), "the run name", 200)
        return self.render(request, "runs.html", runs=self.db.runs(name), name=name or "", shown=data.RUNS_SHOWN)

    def run(self, request: Request) -> Response:
        run_id = _id(request.path_params["run_id"], "the run id")
        run, tasks, events = self.db.run(run_id)
        if run is None:
            return self.error(request, 404, f"no run with id {run_id}")
        return self.render(request, "run.html", run=run, tasks=tasks, events=events,
                           tasks_shown=data.RUN_TASKS_SHOWN, events_shown=data.RUN_EVENTS_SHOWN)

    def keys(self, request: Request) -> Response:
        queue = _queue(request.query_params.get("queue"))
        report = None if queue is None else self.db.keys(queue)
        return self.render(request, "keys.html", queue=queue or "", report=report, shown=data.KEYS_SHOWN)

    def scaling(self, request: Request) -> Response:
        return self.render(request, "scaling.html", view=self.cluster.scaling())

    # -- actions -------------------------------------------------------------------------------

    def retry(self, task_id: int) -> None:
        """What `queueworker retry ID` does, refusals included."""
        with psycopg.connect(self.config.dsn, application_name="queueworker-console", connect_timeout=10) as conn:
            try:
                operations.retry(conn, task_id)
            except operations.RetryRefused as exc:
                raise ActionRefused(str(exc)) from None

    def cancel(self, task_id: int) -> None:
        with psycopg.connect(self.config.dsn, application_name="queueworker-console", connect_timeout=10) as conn:
            if not operations.cancel(conn, task_id, reason="cancelled from the console"):
                raise ActionRefused(f"task {task_id} is not {', '.join(operations.CANCELLABLE)}: nothing to cancel")

    def pause(self, queue: str) -> None:
        with psycopg.connect(self.config.dsn, application_name="queueworker-console", connect_timeout=10) as conn:
            operations.pause(conn, queue)

    def resume(self, queue: str) -> None:
        with psycopg.connect(self.config.dsn, application_name="queueworker-console", connect_timeout=10) as conn:
            if operations.resume(conn, queue) is None:
                raise ActionRefused(f"queue {queue} has no settings: it is not paused")

    async def action(self, request: Request) -> Response:
        """Every POST: actions allowed, same origin, a valid form token; then the action, and a
        redirect to the page it changed (or the refusal, with 409)."""
        if not self.config.allow_actions:
            return self.error(request, 403, "actions are disabled: the console was started without --allow-actions")
        headers = request.headers
        if not auth.same_origin(headers.get("origin"), headers.get("referer"), headers.get("host")):
            return self.error(request, 403, "refused: the form was sent from another site")
        length = headers.get("content-length") or "0"
        if not length.isascii() or not length.isdigit() or int(length) > MAX_FORM_BYTES:
            return self.error(request, 413, "the form is too large")
        form = await request.form(max_files=0, max_fields=10, max_part_size=MAX_FORM_BYTES)
        if not self.signer.valid(request.cookies.get(auth.CSRF_COOKIE), form.get("csrf_token")):
            return self.error(request, 403, "refused: the form's token is missing or stale; reload the page and retry")
        target, verb = request.path_params["target"], request.path_params["verb"]
        if request.path_params["kind"] == "tasks" and verb in ("retry", "cancel"):
            task_id = _id(target, "the task id")
            argument, back = task_id, f"/tasks/{task_id}"
        elif request.path_params["kind"] == "queues" and verb in ("pause", "resume"):
            argument, back = _queue(target), "/queues"
        else:
            return self.error(request, 404, "no such action")
        act: Callable[[Any], None] = getattr(self, verb)
        try:
            await run_in_threadpool(act, argument)
        except ActionRefused as exc:
            return self.error(request, 409, str(exc))
        return RedirectResponse(f"{back}?done={PAST[verb]}", status_code=303)


class Guard(BaseHTTPMiddleware):
    """The Host check, authentication (when a token is set), the CSRF cookie, security headers, and
    errors turned into pages that carry no secret; an unexpected one too, with the same headers."""

    def __init__(self, app: Any, console: Console):
        super().__init__(app)
        self.console = console

    async def dispatch(self, request: Request, call_next: Any) -> Response:
        allowed = self.console.config.allowed_hosts
        if request.url.path != "/healthz" and not auth.served(request.headers.get("host"), allowed):
            return _secure(PlainTextResponse(
                "refused: the Host header names a host this console does not serve (see --allowed-host)\n",
                status_code=400))
        token = self.console.config.token
        if token and request.url.path != "/healthz" and not auth.authorized(
                request.headers.get("authorization"), token):
            response: Response = PlainTextResponse("authentication required\n", status_code=401,
                                                   headers={"WWW-Authenticate": auth.REALM})
            return _secure(response)
        cookie = request.cookies.get(auth.CSRF_COOKIE)
        fresh = cookie is None or not 20 <= len(cookie) <= 200
        request.state.csrf_cookie = self.console.signer.new_cookie() if fresh else cookie
        try:
            response = await call_next(request)
        except BadRequest as exc:
            response = self.console.error(request, 400, str(exc))
        except psycopg.Error as exc:
            if isinstance(exc, PoolTimeout):
                exc = await run_in_threadpool(self.console.db.why_unavailable)
            message = dsns.scrub(dsns.explain(exc, self.console.config.dsn), self.console.secrets())
            response = self.console.error(request, 503, f"database error: {message}")
        except Exception:  # noqa: BLE001 - a bug: logged whole, answered without detail, headers kept
            log.exception("console: unexpected error on %s %s", request.method, request.url.path)
            response = PlainTextResponse("internal error: the console's log says what went wrong\n", status_code=500)
        if fresh:
            response.set_cookie(auth.CSRF_COOKIE, request.state.csrf_cookie, httponly=True, samesite="strict",
                                secure=self.console.config.secure_cookies or request.url.scheme == "https", path="/")
        return _secure(response)


def _secure(response: Response) -> Response:
    response.headers["Content-Security-Policy"] = ("default-src 'none'; style-src 'self'; img-src 'self'; "
                                                   "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "same-origin"
    response.headers["Cache-Control"] = "no-store"
    return response


def create_app(config: ConsoleConfig) -> Starlette:
    console = Console(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        console.db.open()
        try:
            yield
        finally:
            await run_in_threadpool(console.db.close)

    # The pages are plain functions: Starlette runs them in its thread pool, beside the event loop.
    routes = [
        Route("/", lambda request: RedirectResponse("/queues", status_code=303)),
        Route("/healthz", lambda request: PlainTextResponse("ok\n")),
        Route("/queues", console.queues),
        Route("/tasks", console.tasks),
        Route("/tasks/{task_id}", console.task),
        Route("/workers", console.workers),
        Route("/runs", console.runs),
        Route("/runs/{run_id}", console.run),
        Route("/scaling", console.scaling),
        Route("/keys", console.keys),
        Route("/{kind:str}/{target:str}/{verb:str}", console.action, methods=["POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(routes=routes, middleware=[Middleware(Guard, console=console)], lifespan=lifespan)
    app.state.console = console
    return app
