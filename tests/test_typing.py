"""Type information and API docs as a user meets them: the compiled classes' stubs match
the runtime (mypy's stubtest), a program using the whole public API passes ``mypy --strict``
and runs, every public method documents its parameters, and pdoc builds the API page."""
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

import rmqstore
from rmqstore import MessageStore

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "tests" / "typing_example.py"


def _mypy(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "mypy", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


def test_package_ships_py_typed_and_stubs():
    pkg = Path(rmqstore.__file__).parent
    assert (pkg / "py.typed").is_file() and (pkg / "_message.pyi").is_file()


def test_stubs_match_the_compiled_module(tmp_path):
    cfg = tmp_path / "mypy.ini"
    cfg.write_text("[mypy]\nignore_missing_imports = True\nfollow_imports = silent\n")
    p = subprocess.run([sys.executable, "-m", "mypy.stubtest", "rmqstore._message", "--mypy-config-file", str(cfg),
                        "--allowlist", str(ROOT / "tests" / "stubtest_allowlist.txt")],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr


def test_example_passes_mypy_strict_and_runs(tmp_path):
    p = _mypy("--strict", "--follow-imports=silent", str(EXAMPLE))
    assert p.returncode == 0, p.stdout + p.stderr
    run = subprocess.run([sys.executable, str(EXAMPLE), str(tmp_path / "s")], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr


def test_mypy_strict_catches_a_misuse(tmp_path):
    """The check above can fail: a wrong type through the public API is reported."""
    bad = tmp_path / "bad.py"
    bad.write_text("from rmqstore import Message, MessageStore\n"
                   "def f(s: MessageStore) -> None:\n"
                   "    n: int = s.put(Message('T', b'x')).msg_id\n"
                   "    s.get_messages('T', '0', 0)\n"
                   "    b: int = s.get_messages('T', 0, 0).messages[0].body\n"   # a list of MessageExt
                   "    c: str = s.read_queue_columns('T', 0)['count']\n")    # the columns, key by key
    p = _mypy("--strict", "--follow-imports=silent", str(bad), cwd=ROOT)
    assert p.returncode == 1 and p.stdout.count("error:") == 4, p.stdout


def _public_callables():
    for cls in (MessageStore, rmqstore.StoreConfig, rmqstore.Message, rmqstore.GetMessageResult):
        for name, obj in vars(cls).items():
            if name.startswith("_") and name != "__init__":
                continue
            f = obj.fget if isinstance(obj, property) else obj
            if callable(f) or isinstance(obj, property):
                yield f"{cls.__name__}.{name}", f, isinstance(obj, property)


def test_every_public_method_documents_its_parameters():
    undocumented = []
    for name, f, is_property in _public_callables():
        doc = inspect.getdoc(f) or ""
        try:
            params = [] if is_property else [n for n, p in inspect.signature(f).parameters.items()
                                             if n != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        except (TypeError, ValueError):   # a compiled method without a signature
            params = []
        if name.endswith(".__init__") and f is getattr(object, "__init__", None) or "Initialize self" in doc:
            cls = getattr(rmqstore, name.split(".")[0])   # a generated __init__: the class documents its fields
            doc, params = inspect.getdoc(cls) or "", []
        missing = [p for p in params if p not in doc]
        if not doc or missing:
            undocumented.append(f"{name}: {'no docstring' if not doc else 'does not mention ' + ', '.join(missing)}")
    assert undocumented == []


def test_api_page_builds(tmp_path):
    pytest.importorskip("pdoc")
    out = tmp_path / "api"
    p = subprocess.run([sys.executable, "-m", "pdoc", "rmqstore", "-o", str(out)], capture_output=True, text=True,
                       timeout=600, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert p.returncode == 0, p.stdout + p.stderr
    page = (out / "rmqstore.html").read_text()
    for method in ("put_batch", "get_messages", "query_by_key", "offset_by_time", "verify"):
        assert f"MessageStore.{method}" in page, method
