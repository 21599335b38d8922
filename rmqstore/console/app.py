"""The console's web application (Starlette): HTML pages and their JSON API routes from the
page table (pages.py), the live tail as server-sent events, health tasks, raw downloads,
``/openapi.json`` and the packaged static files.

Safety: every response carries a Content-Security-Policy that allows only the console's own
scripts and styles (no inline script runs, whatever a message holds), ``nosniff`` and
``frame-ancestors 'none'``. Templates autoescape every value, and message text is shown with
control and bidirectional characters as visible escapes. With a token (listening beyond
loopback) every request must carry it (``?token=`` once, then a cookie, or
``Authorization: Bearer``); on loopback the Host header must name loopback, so a page of
another site cannot reach the console through DNS rebinding. The POSTs (starting a health
task; the DLQ resend, the only write, which exists only with a writer store) need the page's
CSRF token in a header, which other sites cannot send."""
from __future__ import annotations

import asyncio
import hmac
import json
import os
import secrets
import time
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qsl, urlencode

import anyio
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

import rmqstore
from rmqstore import MessageNotFoundError, batch
from rmqstore.console import is_loopback, limits, openapi, views
from rmqstore.console.dlq import resend_dead_letter
from rmqstore.console.filters import FILTER_MODES, make_filter, searchable, tag_set
from rmqstore.console.pages import BY_NAME, NAV, Params, parse_number
from rmqstore.console.stores import ServedStore, StoreSet
from rmqstore.console.tasks import KINDS, Tasks
from rmqstore.display import local_time, shown
from rmqstore.errors import InvalidArgumentError, StoreError

COOKIE = "rmqstore_console"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
TAIL_POLL = 0.3          # seconds between looks at the commitlog end
TAIL_BATCH = 200         # messages an event batch holds at most
TAIL_STREAM_SECONDS = 600  # a stream ends after this (the browser reconnects with Last-Event-ID)
TAIL_BODY = 1024         # bytes of each body a tail event carries


def same(given: str, secret: str) -> bool:
    """Constant-time comparison of a request's token with ours (any characters)."""
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), secret.encode())


def visible(value: Any) -> str:
    """Message text as a page shows it: control and bidirectional characters as escapes
    (``\\x1b``, ``\\u202e``); newlines and tabs kept. Autoescaping then makes it inert HTML."""
    if value is None:
        return ""
    return "\n".join(shown(line.replace("\t", "    ")) for line in str(value).split("\n"))


class _Templates(Environment):
    """Jinja whose ``d.name`` reads a dict's item before its attribute: message documents
    have keys such as ``keys`` and ``pop`` that are also dict methods."""

    def getattr(self, obj: Any, attribute: str) -> Any:
        if isinstance(obj, dict) and attribute in obj:
            return obj[attribute]
        return super().getattr(obj, attribute)


def _templates() -> Environment:
    env = _Templates(loader=PackageLoader("rmqstore.console", "templates"),
                      autoescape=select_autoescape(default=True, default_for_string=True))
    env.filters["visible"] = visible
    env.filters["when"] = lambda ms: local_time(ms) if ms else "-"
    env.filters["qs"] = lambda d: urlencode({k: v for k, v in d.items() if v not in (None, "", False)})
    return env


class Guard:
    """ASGI middleware: Host check (loopback), token check (beyond loopback), security headers."""

    def __init__(self, app: Any, token: str | None, loopback: bool):
        self.app, self.token, self.loopback = app, token, loopback

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host", "")
        hostname = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        if self.loopback and not is_loopback(hostname):
            return await PlainTextResponse("Host not allowed", 421)(scope, receive, send)
        if self.token is not None:
            query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
            given = query.get("token")
            if given is not None and same(given, self.token):
                rest = urlencode({k: v for k, v in query.items() if k != "token"})
                r = RedirectResponse(scope["path"] + ("?" + rest if rest else ""), 303)
                r.set_cookie(COOKIE, self.token, httponly=True, samesite="strict")
                return await self._send(r, scope, receive, send)
            cookie = SimpleCookie(headers.get("cookie", ""))
            have = cookie[COOKIE].value if COOKIE in cookie else headers.get("authorization", "")[len("Bearer "):]
            if not same(have, self.token):
                return await PlainTextResponse("token required (see the URL the console printed)", 401)(
                    scope, receive, send)
        await self._send(self.app, scope, receive, send)

    @staticmethod
    async def _send(app: Any, scope: Any, receive: Any, send: Any) -> None:
        async def with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = list(message["headers"]) + [
                    (b"content-security-policy", CSP.encode()), (b"x-content-type-options", b"nosniff"),
                    (b"referrer-policy", b"no-referrer"), (b"cache-control", b"no-store")]
            await send(message)
        await app(scope, receive, with_headers)


class Console:
    """The served stores, the templates, the tasks and the CSRF token of one console."""

    def __init__(self, stores: StoreSet, writer: Any = None):
        self.stores = stores
        self.writer = writer   # a writer MessageStore of one served store: DLQ resend allowed on it
        self.env = _templates()
        self.tasks = Tasks()
        self.csrf = secrets.token_urlsafe(24)

    def render(self, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        store = context.get("store")
        writable = self.writer is not None and store is not None and store.path == self.writer.path
        html = self.env.get_template(template).render(stores=self.stores.stores, nav=NAV, csrf=self.csrf,
                                                      allow_writes=writable,
                                                      version=rmqstore.__version__, **context)
        return HTMLResponse(html, status)

    def served(self, request: Request) -> ServedStore:
        """The store the path's ``{store}`` number names (InvalidArgumentError else)."""
        return self.stores[parse_number("a store (given by its number)", request.path_params["store"])]

    # -- pages and their API routes ---------------------------------------------------------
    async def page(self, request: Request) -> Response:
        """A page (``/s/N/PAGE``, HTML) or its JSON answer (``/api/s/N/PAGE``)."""
        name = request.path_params["page"]
        api = request.url.path.startswith("/api/")
        try:
            page = BY_NAME.get(name)
            if page is None:
                raise MessageNotFoundError(f"no page {name!r}")
            st = self.served(request)
            data = await anyio.to_thread.run_sync(_view, page, st, Params(request.query_params))
        except (InvalidArgumentError, StoreError, ValueError) as e:
            status = 404 if isinstance(e, MessageNotFoundError) else 400
            if api:
                return JSONResponse({"error": str(e)}, status)
            return self.render("error.html", status, error=str(e), title="Error", store=None)
        if api:
            return JSONResponse(data)
        return self.render(f"{name}.html", store=st, page=page, title=page.title, data=data,
                           args=dict(request.query_params), filter_modes=FILTER_MODES)

    async def home(self, request: Request) -> Response:
        """The list of served stores (straight to the overview when there is one)."""
        if len(self.stores.stores) == 1:
            return RedirectResponse("/s/0/overview", 303)
        return self.render("home.html", title="Stores", store=None)

    async def store_list(self, request: Request) -> Response:
        """``/api/stores``: number, name and path of each served store."""
        return JSONResponse([{"number": s.number, "name": s.name, "path": s.path} for s in self.stores.stores])

    async def openapi(self, request: Request) -> Response:
        """``/openapi.json``: the API's OpenAPI document."""
        return JSONResponse(openapi.document(rmqstore.__version__))

    async def raw(self, request: Request) -> Response:
        """A message's body as stored, as a download."""
        try:
            st = self.served(request)
            offset = Params(request.query_params).number("offset")
            m = await anyio.to_thread.run_sync(_message_at, st, offset)
        except (InvalidArgumentError, StoreError) as e:
            return JSONResponse({"error": str(e)}, 404 if isinstance(e, MessageNotFoundError) else 400)
        return Response(bytes(m.body), media_type="application/octet-stream",
                        headers={"content-disposition": f'attachment; filename="message-{m.phy_offset}.bin"'})

    # -- health tasks ------------------------------------------------------------------------
    async def tasks_of_store(self, request: Request) -> Response:
        """A store's health tasks (GET), or a new one of ``kind`` (POST, CSRF header)."""
        try:
            st = self.served(request)
            if request.method == "POST":
                if not same(request.headers.get("x-console-csrf", ""), self.csrf):
                    return JSONResponse({"error": "missing or wrong X-Console-CSRF header"}, 403)
                kind = Params(request.query_params).choice("kind", KINDS)
                return JSONResponse(self.tasks.start(kind, st.number, st.path, st.config).as_dict())
        except (InvalidArgumentError, StoreError) as e:
            return JSONResponse({"error": str(e)}, 400)
        return JSONResponse([t.as_dict() for t in self.tasks.of_store(st.number)])

    async def task(self, request: Request) -> Response:
        """One task's state, progress and result."""
        t = self.tasks.tasks.get(int(request.path_params["id"]))
        if t is None:
            return JSONResponse({"error": "no such task"}, 404)
        return JSONResponse(t.as_dict())

    # -- the one write: resend a dead letter ------------------------------------------------
    async def resend(self, request: Request) -> Response:
        """Put a copy of a ``%DLQ%`` message back on its origin topic (writer only)."""
        try:
            st = self.served(request)
            if not same(request.headers.get("x-console-csrf", ""), self.csrf):
                return JSONResponse({"error": "missing or wrong X-Console-CSRF header"}, 403)
            if self.writer is None or self.writer.path != st.path:
                return JSONResponse({"error": "writes are off (rmqstore serve --console --allow-writes)"}, 403)
            offset = Params(request.query_params).number("offset")
            result = await anyio.to_thread.run_sync(resend_dead_letter, self.writer, offset)
        except (InvalidArgumentError, StoreError) as e:
            return JSONResponse({"error": str(e)}, 404 if isinstance(e, MessageNotFoundError) else 400)
        return JSONResponse(result)

    # -- live tail ---------------------------------------------------------------------------
    async def tail(self, request: Request) -> Response:
        """Server-sent events of the messages appended from ``from`` (or Last-Event-ID, or
        the end); a start that is neither a record's start nor the end is refused (400)."""
        try:
            st = self.served(request)
            p = Params(request.query_params)
            resume = request.headers.get("last-event-id", "")
            start = parse_number("Last-Event-ID", resume) if resume else p.optional_number("from")
            topic, wanted = p.text("topic"), tag_set(p.text("tags"))
            content = make_filter(p.text("q"), p.choice("mode", FILTER_MODES), p.flag("icase"))
            if start is not None:
                await anyio.to_thread.run_sync(_check_start, st, start)
        except (InvalidArgumentError, StoreError) as e:
            return JSONResponse({"error": str(e)}, 400)

        def read(pos: int) -> tuple[list[dict[str, Any]], int]:
            out, deadline = [], time.monotonic() + limits.DEADLINE
            with st.reading() as h:
                for m in h.store.scan(pos):
                    pos = m.phy_offset + m.store_size
                    if (topic is None or m.topic == topic) and (wanted is None or m.tags in wanted) and \
                            (content is None or _matches(content, m, deadline)):
                        row = views.summary(m)
                        row["body"] = bytes(m.body[:TAIL_BODY]).decode("utf-8", "replace")
                        out.append(row)
                    if len(out) >= TAIL_BATCH or time.monotonic() > deadline:
                        break
            return out, pos

        async def events() -> Any:
            pos = start if start is not None else await anyio.to_thread.run_sync(batch.end_offset, st.path)
            yield f"retry: 1000\nid: {pos}\nevent: hello\ndata: {json.dumps({'from': pos})}\n\n"
            ends = time.monotonic() + TAIL_STREAM_SECONDS
            quiet = 0.0
            while time.monotonic() < ends:
                try:
                    rows, new = await anyio.to_thread.run_sync(read, pos)
                except StoreError as e:   # one problem event ends the stream (a reconnect checks its start)
                    yield f"event: problem\ndata: {json.dumps({'error': str(e)})}\n\n"
                    return
                if rows or new != pos:
                    pos = new
                    yield f"id: {pos}\nevent: messages\ndata: {json.dumps(rows)}\n\n"
                    quiet = 0.0
                else:
                    quiet += TAIL_POLL
                    if quiet >= 15:
                        yield ": keep-alive\n\n"
                        quiet = 0.0
                    await asyncio.sleep(TAIL_POLL)

        return StreamingResponse(events(), media_type="text/event-stream", headers={"x-accel-buffering": "no"})


def _view(page: Any, st: ServedStore, p: Params) -> dict[str, Any]:
    """A page's answer, read from a handle held until it is made."""
    with st.reading() as h:
        return page.view(st, h, p)


def _message_at(st: ServedStore, offset: int) -> Any:
    with st.reading() as h:
        return h.store.get_by_offset(offset)


def _check_start(st: ServedStore, start: int) -> None:
    """That a tail may start at commitlog offset ``start``: a message's start, or the end
    (InvalidArgumentError or the store's error else)."""
    with st.reading() as h:
        s = h.store
        end = batch.end_offset(st.path, s.max_phy_offset)
        if start == end:
            return
        if not s.min_phy_offset <= start < end:
            raise InvalidArgumentError(f"from {start} is outside the commitlog ({s.min_phy_offset}..{end})")
        if start < s.max_phy_offset:
            s.get_by_offset(start)
        else:   # written after this handle opened: a record must start there
            batch.end_offset(st.path, start)


def _matches(content: Any, m: Any, deadline: float) -> bool:
    """The tail's content filter: a message whose match outlasts the batch's time counts as
    not matching, so one message cannot stall the tail."""
    try:
        return bool(content.matches(searchable(m), deadline))
    except TimeoutError:
        return False


def build(paths: list[str], token: str | None = None, loopback: bool = True, writer: Any = None,
          config: Any = None) -> tuple[Any, Console]:
    """The ASGI application serving the stores at ``paths`` (and its Console, whose
    ``stores`` the caller closes); ``writer`` and ``config`` as in rmqstore.console.running."""
    console = Console(StoreSet(paths, config), writer)
    static = os.path.join(os.path.dirname(__file__), "static")
    routes = [
        Route("/", console.home), Route("/openapi.json", console.openapi),
        Route("/api/stores", console.store_list),
        Route("/api/s/{store}/message/raw", console.raw),
        Route("/api/s/{store}/tail/events", console.tail),
        Route("/api/s/{store}/tasks", console.tasks_of_store, methods=["GET", "POST"]),
        Route("/api/s/{store}/dlq/resend", console.resend, methods=["POST"]),
        Route("/api/tasks/{id:int}", console.task),
        Route("/api/s/{store}/{page}", console.page), Route("/s/{store}/{page}", console.page),
        Mount("/static", StaticFiles(directory=static), name="static"),
    ]
    async def not_found(request: Request, exc: Exception) -> Response:
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": f"no such API route: {request.url.path}"}, 404)
        return console.render("error.html", 404, error="no such page", title="Not found", store=None)

    return Guard(Starlette(routes=routes, exception_handlers={404: not_found}), token, loopback), console
