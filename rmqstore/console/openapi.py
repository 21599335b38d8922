"""The OpenAPI 3.1 document of the console's JSON API (``/openapi.json``), built from the
page table, so every page's API route is described."""
from __future__ import annotations

from typing import Any

from rmqstore.console.pages import PAGES

_STORE = {"name": "store", "in": "path", "required": True, "schema": {"type": "integer"},
          "description": "the store's number in the served list (GET /api/stores)"}
_ERRORS = {"400": {"description": "a parameter the console or the store refuses: {error}"},
           "404": {"description": "no such store, topic or message: {error}"}}


def _param(name: str, kind: str, text: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": "(required)" in text, "schema": {"type": kind},
            "description": text}


def document(version: str) -> dict[str, Any]:
    """The OpenAPI document of the console of rmqstore ``version``: the fixed routes and
    each page's API route with its parameters."""
    paths: dict[str, Any] = {
        "/api/stores": {"get": {"summary": "the served stores (number, name, path)",
                                "responses": {"200": {"description": "a list of stores"}}}},
        "/api/s/{store}/message/raw": {"get": {
            "summary": "a message's body as stored, as a download", "parameters": [
                _STORE, _param("offset", "integer", "the message's commitlog offset (required)")],
            "responses": {"200": {"description": "application/octet-stream"}, **_ERRORS}}},
        "/api/s/{store}/tail/events": {"get": {
            "summary": "live tail: messages as they are appended (server-sent events; id is the commitlog "
                       "offset after the message, Last-Event-ID resumes)", "parameters": [
                _STORE, _param("from", "integer", "commitlog offset to start at (default: the end)"),
                _param("topic", "string", "only this topic"), _param("tags", "string", "tag expression"),
                _param("q", "string", "content filter"), _param("mode", "string", "substring | regex")],
            "responses": {"200": {"description": "text/event-stream of message events"}}}},
        "/api/s/{store}/tasks": {
            "get": {"summary": "the store's health tasks", "parameters": [_STORE],
                    "responses": {"200": {"description": "a list of tasks"}}},
            "post": {"summary": "start a health task (header X-Console-CSRF from the page's meta tag)",
                     "parameters": [_STORE, _param("kind", "string", "verify | digest | recovery (required)")],
                     "responses": {"200": {"description": "the task"}, "403": {"description": "no CSRF token"}}}},
        "/api/s/{store}/dlq/resend": {"post": {
            "summary": "resend a dead letter to its origin topic (only under rmqstore serve --console "
                       "--allow-writes; header X-Console-CSRF)",
            "parameters": [_STORE, _param("offset", "integer", "the %DLQ% message's commitlog offset (required)")],
            "responses": {"200": {"description": "where the copy went"},
                          "403": {"description": "writes are off, or no CSRF token"}, **_ERRORS}}},
        "/api/tasks/{id}": {"get": {"summary": "a task's progress (done/total bytes) and result",
                                    "parameters": [{"name": "id", "in": "path", "required": True,
                                                    "schema": {"type": "integer"}}],
                                    "responses": {"200": {"description": "the task"}, **_ERRORS}}},
    }
    for p in PAGES:
        paths[f"/api/s/{{store}}/{p.name}"] = {"get": {
            "summary": f"{p.title}: the answer the page /s/{{store}}/{p.name} shows",
            "parameters": [_STORE] + [_param(*x) for x in p.params],
            "responses": {"200": {"description": "a JSON object"}, **_ERRORS}}}
    return {"openapi": "3.1.0",
            "info": {"title": "rmqstore console", "version": version,
                     "description": "Read-only JSON API over RocketMQ store directories. Message fields use "
                                    "RocketMQ's MessageExt names, as `rmqstore ... --json` prints them."},
            "paths": paths}
