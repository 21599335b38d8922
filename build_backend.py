"""PEP 517 backend: setuptools', asking for numpy and Cython only where there is work for them.

A kernel whose module built in the source tree is newer than every file it is made from is
not compiled again, so adding an extra to an editable install (``pip install -e ".[x]"``)
needs neither numpy's headers nor Cython in its build environment, and pip installs neither.
An sdist ships the C that Cython generated (it has a PKG-INFO at its root), so building one
needs numpy's headers and a C compiler but no Cython; a git checkout needs Cython too (and
numpy's declarations to translate, as for making an sdist).
setup.py takes the kernels and their inputs from here.
"""
import glob
import os
import sysconfig
from pathlib import Path

from setuptools import build_meta
from setuptools.build_meta import *  # noqa: F401,F403 (the hooks this backend does not change)

KERNELS = ["_gate", "_segment", "_record", "_message", "_read", "_columns", "_encode", "_rows", "_append", "_cq",
           "_index_file", "_index", "_index_check", "_verify", "_arrow", "_properties", "_pack", "_consume", "_flusher",
           "_toucher", "_reput"]
# Cython's memoryview code, generated once into this module that the kernels import, instead of
# into each of the ten kernels that use memoryviews: it halves their C.
SHARED = "_cyutility"
MODULES = [*KERNELS, SHARED]
FROM_SDIST = Path("PKG-INFO").exists()
NUMPY = ["numpy>=1.25"]
CYTHON = ["Cython>=3.1,<4"]   # 3.1: the shared utility module


def kernel_source(name: str) -> str:
    """The kernel's Cython source, or in an sdist the C generated from it (the shared module
    has only C, which Cython generates in a git checkout)."""
    return f"rmqstore/{name}.c" if FROM_SDIST or name == SHARED else f"rmqstore/{name}.pyx"


def kernel_depends() -> list[str]:
    """The files every kernel is also made from: the C layer and the Cython declarations."""
    return sorted(glob.glob("cext/*.c")) + sorted(glob.glob("cext/*.h")) + sorted(glob.glob("rmqstore/*.pxd"))


def built_in_tree(name: str) -> Path | None:
    """The kernel's module built in the source tree, if it is newer than every file of the
    project it is made from."""
    built = Path("rmqstore", name + sysconfig.get_config_var("EXT_SUFFIX"))
    if not built.exists() or not Path(kernel_source(name)).exists():
        return None
    newest = max(os.path.getmtime(p) for p in [kernel_source(name), *kernel_depends()])
    return built if os.path.getmtime(built) > newest else None


def _to_compile() -> list[str]:
    if all(built_in_tree(name) for name in MODULES):
        return []
    return NUMPY + ([] if FROM_SDIST else CYTHON)


def get_requires_for_build_wheel(config_settings=None):
    return build_meta.get_requires_for_build_wheel(config_settings) + _to_compile()


def get_requires_for_build_editable(config_settings=None):
    return build_meta.get_requires_for_build_editable(config_settings) + _to_compile()


def get_requires_for_build_sdist(config_settings=None):
    return build_meta.get_requires_for_build_sdist(config_settings) + ([] if FROM_SDIST else NUMPY + CYTHON)
