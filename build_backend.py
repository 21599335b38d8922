"""PEP 517 backend: setuptools', asking for Cython only where there is Cython to translate.

An sdist ships the C that Cython generated (it has a PKG-INFO at its root), so building one
needs a C compiler and numpy's headers but no Cython; a git checkout needs Cython too.
"""
from pathlib import Path

from setuptools import build_meta
from setuptools.build_meta import *  # noqa: F401,F403 (the hooks this backend does not change)

CYTHON = ["Cython>=3,<4"]


def _translate() -> list[str]:
    return [] if Path("PKG-INFO").exists() else CYTHON


def get_requires_for_build_wheel(config_settings=None):
    return build_meta.get_requires_for_build_wheel(config_settings) + _translate()


def get_requires_for_build_editable(config_settings=None):
    return build_meta.get_requires_for_build_editable(config_settings) + _translate()


def get_requires_for_build_sdist(config_settings=None):
    return build_meta.get_requires_for_build_sdist(config_settings) + _translate()
