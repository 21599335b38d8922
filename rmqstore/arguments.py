"""Argument checks by annotation for the public API (MessageStore's methods, the batch
decoder's functions): an argument whose annotation is listed in ARG_CHECKS is checked
before the call, so bad input is an InvalidArgumentError (InvalidArgumentTypeError for a
wrong type), never a bare TypeError, OverflowError or UnicodeError from deep inside."""
from __future__ import annotations

import functools
import inspect
import os
import threading
from typing import Any, Callable, NoReturn, TypeVar

import rmqstore._gate as _gate
from rmqstore import _message
from rmqstore.config import StoreConfig
from rmqstore.errors import InvalidArgumentError, InvalidArgumentTypeError, check_call

F = TypeVar("F", bound=Callable[..., Any])

_TIMES = ("begin", "end", "timestamp")     # times clamp to the stored range, as RocketMQ's do
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


def _int(name: str, v: Any) -> Any:
    """An int (no bool, float or str); an int64 unless it is a time, which may be any int."""
    if type(v) is int and (_I64_MIN <= v <= _I64_MAX or name in _TIMES):    # the common case, cheaply
        return v
    return _message.int_arg(name, v, float("-inf"), float("inf")) if name in _TIMES else \
        _message.int_arg(name, v, _I64_MIN, _I64_MAX)


def _bad_type(name: str, v: Any, due: str) -> NoReturn:
    raise InvalidArgumentTypeError(f"{name} must be {due}, not {type(v).__name__}")


def _bool(name: str, v: Any) -> Any:
    return v if type(v) is bool else _bad_type(name, v, "True or False")


def _seconds(name: str, v: Any) -> Any:
    """None or an int/float of seconds (no bool) that a wait or a clock accepts."""
    if v is None:
        return v
    if type(v) not in (int, float):
        _bad_type(name, v, "a number of seconds or None")
    if not -threading.TIMEOUT_MAX <= v <= threading.TIMEOUT_MAX:   # also refuses NaN
        raise InvalidArgumentError(f"{name} {v} out of range [-{threading.TIMEOUT_MAX}, {threading.TIMEOUT_MAX}]")
    return v


def _callable(name: str, v: Any) -> Any:
    return v if v is None or callable(v) else _bad_type(name, v, "callable or None")


def _str_sequence(name: str, v: Any) -> Any:
    """A list/tuple-like of str (each element is checked where it is used), any other
    iterable as a list: a call run again (a read a rebuild closed files under) reads it
    again, which a generator would not allow. Iterable is what iter() takes: a 0-d numpy
    array has __iter__ but refuses it."""
    try:
        it = iter(v)
    except TypeError:
        _bad_type(name, v, "a sequence of str")
    if isinstance(v, (str, bytes)):
        _bad_type(name, v, "a sequence of str")
    return v if type(v) in (list, tuple) else list(it)


def path_arg(name: str, v: Any) -> Any:
    """A str or os.PathLike naming a file or directory (not empty, no NUL, encodable), as
    a plain str: a str subclass's or path object's own methods run no later (its
    __fspath__ once, here: failing or returning neither str nor bytes is refused)."""
    if not isinstance(v, (str, os.PathLike)):
        _bad_type(name, v, "a str or os.PathLike")
    try:
        p = str.__str__(v) if isinstance(v, str) else os.fspath(v)
    except Exception as e:   # noqa: BLE001 - the caller's __fspath__, whatever it raises
        raise InvalidArgumentTypeError(f"{name}: {type(v).__name__}.__fspath__() failed: "
                                       f"{type(e).__name__}: {e}") from e
    p = os.fsdecode(p) if isinstance(p, bytes) else p
    if not p or "\0" in p:
        raise InvalidArgumentError(f"{name} must be a non-empty path without NUL, got {p!r}")
    try:
        os.fsencode(p)
    except UnicodeEncodeError:
        raise InvalidArgumentError(f"{name} {p!r} cannot be a file name (a lone surrogate)") from None
    return p


def _dict(name: str, v: Any) -> Any:
    return v if isinstance(v, dict) else _bad_type(name, v, "a dict")


def _dicts(name: str, v: Any) -> Any:
    if not isinstance(v, (list, tuple)) or not all(isinstance(d, dict) for d in v):
        _bad_type(name, v, "a list of dicts")
    return v


def _config(name: str, v: Any) -> Any:
    return v if v is None or isinstance(v, StoreConfig) else _bad_type(name, v, "a StoreConfig or None")


# annotation -> (the kind _gate.ArgChecks passes without a call when plainly fine, the check)
ARG_CHECKS: dict[str, tuple[int, Callable[[str, Any], Any]]] = {
    "str": (_gate.ARG_STR, _message.text_arg),
    "str | None": (_gate.ARG_STR | _gate.ARG_OR_NONE, lambda name, v: v if v is None else _message.text_arg(name, v)),
    "int": (_gate.ARG_INT64, _int),
    "QueueId": (_gate.ARG_QUEUE_ID, lambda name, v: _message.int_arg(name, v, 0, 0x7FFFFFFF)),
    "int | None": (_gate.ARG_INT64 | _gate.ARG_OR_NONE, lambda name, v: v if v is None else _int(name, v)),
    "bool": (_gate.ARG_OTHER, _bool),
    "float | None": (_gate.ARG_OTHER, _seconds),
    "Progress | None": (_gate.ARG_OTHER, _callable),
    "Sequence[str]": (_gate.ARG_OTHER, _str_sequence),
    "Sequence[str] | None": (_gate.ARG_OTHER, lambda name, v: v if v is None else _str_sequence(name, v)),
    "Iterable[str]": (_gate.ARG_OTHER, _str_sequence),
    "str | os.PathLike[str]": (_gate.ARG_OTHER, path_arg),
    "str | os.PathLike[str] | None": (_gate.ARG_OTHER, lambda name, v: v if v is None else path_arg(name, v)),
    "StoreConfig | None": (_gate.ARG_OTHER, _config),
    "dict[str, Any]": (_gate.ARG_OTHER, _dict),
    "Sequence[dict[str, Any]]": (_gate.ARG_OTHER, _dicts),
}


def arg_checks(func: Callable[..., Any], skip: int = 0) -> _gate.ArgChecks:
    """The checks of the arguments of ``func`` (after its first ``skip``, e.g. self) that
    carry an annotation listed in ARG_CHECKS."""
    params = list(inspect.signature(func).parameters.values())[skip:]
    return _gate.ArgChecks([(i, p.name, *ARG_CHECKS[p.annotation]) for i, p in enumerate(params)
                            if isinstance(p.annotation, str) and p.annotation in ARG_CHECKS])


def checked(skip: int = 0) -> Callable[[F], F]:
    """Decorator: check the annotated arguments of the function (see arg_checks) before it
    runs, and a call that does not fit its signature (see errors.check_call); ``skip=1``
    for a method."""
    def wrap(func: F) -> F:
        checks = arg_checks(func, skip)

        @functools.wraps(func)
        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                return func(*args[:skip], *checks(args[skip:], kwargs), **kwargs)
            except TypeError:
                check_call(func, args, kwargs)
                raise
        return run  # type: ignore[return-value]
    return wrap


def decimal_int(text: str) -> int | None:
    """``text`` as an int when it is a decimal integer in ASCII (an optional '-', at most 19
    digits), else None: what a text option (Spark's, always strings) may hold. int() also
    takes "1_0", " 12" and other scripts' digits, and refuses 4300 digits with a bare
    ValueError."""
    digits = text[1:] if text.startswith("-") else text
    return int(text) if digits.isascii() and digits.isdigit() and len(digits) <= 19 else None


def positive(name: str, v: int) -> int:
    """``v`` (an int already checked) if it is above 0."""
    if v <= 0:
        raise InvalidArgumentError(f"{name} must be above 0, got {v}")
    return v
