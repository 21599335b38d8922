"""Build: Cython kernels in rmqstore/ linked with the C mmap layer in cext/.

cext/ is compiled once, into a static library every kernel links. A git checkout translates
the kernels with Cython; an sdist ships the generated C, so installing one needs no Cython
(build_backend.py asks for Cython only when there is no PKG-INFO, the mark of an sdist). A
kernel whose built module in the source tree is newer than the files it is made from is
neither translated nor compiled again, so an editable install into a venv that has the build
(to add an extra, say) compiles nothing.
"""
import glob
import os
import shutil
import sysconfig
from pathlib import Path

import numpy
from setuptools import Extension, setup
from setuptools.command.build_clib import build_clib
from setuptools.command.build_ext import build_ext
from setuptools.command.sdist import sdist

CEXT = sorted(glob.glob("cext/*.c"))
CEXT_HEADERS = sorted(glob.glob("cext/*.h"))
KERNELS = ["_gate", "_segment", "_record", "_message", "_read", "_columns", "_encode", "_rows", "_append", "_cq",
           "_index_file", "_index", "_index_check", "_verify", "_arrow", "_properties", "_pack", "_consume", "_flusher",
           "_toucher", "_reput"]
# -g0: no debug info in release builds (Python's CFLAGS carry -g); it doubled the objects' size
# and cost a fifth of the compile time. -O2, not -O3: against an -O3 build in the same quiet
# run (`rmqstore bench --no-peers --messages 1000000`, 3 runs each) no row was slower, and the
# kernels compile in about half the CPU time (52 s against ~95 s on 2 cores).
CFLAGS = ["-O2", "-g0", "-std=gnu11", "-Wno-unused-function"]
FROM_SDIST = Path("PKG-INFO").exists()
# Kernels are translated and compiled in parallel, one job per usable core.
JOBS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def kernel(name: str) -> Extension:
    """One kernel module: its Cython source (or, in an sdist, the C generated from it)."""
    return Extension(
        f"rmqstore.{name}",
        [f"rmqstore/{name}.c" if FROM_SDIST else f"rmqstore/{name}.pyx"],
        include_dirs=["cext", numpy.get_include()],
        libraries=["rmqcext", "z"],   # cext first: it calls zlib
        depends=CEXT + CEXT_HEADERS + glob.glob("rmqstore/*.pxd"),
        extra_compile_args=CFLAGS,
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    )


def translate(extensions: list[Extension]) -> None:
    """Points the kernels at their C, Cython translating each .pyx whose C is stale (a git
    checkout); an sdist's kernels are built from the C it ships."""
    if FROM_SDIST or not extensions:
        return
    from Cython.Build import cythonize  # asked for by build_backend.py only here

    made = cythonize(extensions, compiler_directives={"language_level": 3, "embedsignature": True}, nthreads=JOBS)
    for ext, translated in zip(extensions, made, strict=True):
        ext.sources = translated.sources


def built_in_tree(ext: Extension) -> Path | None:
    """The kernel's module built in the source tree, if it is newer than every file of the
    project it is made from."""
    built = Path(ext.name.replace(".", os.sep) + sysconfig.get_config_var("EXT_SUFFIX"))
    if not built.exists():
        return None
    newest = max(os.path.getmtime(p) for p in [*ext.sources, *ext.depends])
    return built if os.path.getmtime(built) > newest else None


class BuildClib(build_clib):
    """Builds cext/'s static library, unless no kernel is to be compiled."""

    def run(self) -> None:
        build_ext_cmd = self.get_finalized_command("build_ext")
        if build_ext_cmd.force or not all(built_in_tree(ext) for ext in self.distribution.ext_modules):
            super().run()


class BuildExt(build_ext):
    """build_ext that translates with Cython when building (not when pip reads setup.py to ask
    what the build needs, before Cython is there), and reuses a kernel already built in the
    source tree when it is newer than the project's files it is made from: an editable build
    runs in a fresh temporary directory, with a freshly installed Cython and numpy whose files
    all look new, where every kernel would otherwise be translated and compiled again."""

    def finalize_options(self) -> None:
        super().finalize_options()
        self.parallel = self.parallel or JOBS   # setup(options=...) does not reach an editable build

    def run(self) -> None:
        translate([ext for ext in self.extensions if self.force or built_in_tree(ext) is None])
        self.run_command("build_clib")   # `build` runs it first; `build_ext --inplace` alone does not
        super().run()

    def build_extension(self, ext: Extension) -> None:
        built = None if self.force else built_in_tree(ext)
        target = Path(self.get_ext_fullpath(ext.name))
        if built is not None and built.resolve() != target.resolve():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(built, target)
            return
        super().build_extension(ext)


class TranslatingSdist(sdist):
    """An sdist carries the generated C, so installing it needs no Cython."""

    def run(self) -> None:
        translate(self.distribution.ext_modules)
        super().run()


setup(
    ext_modules=[kernel(name) for name in KERNELS],
    libraries=[("rmqcext", {"sources": CEXT, "include_dirs": ["cext"], "cflags": CFLAGS})],
    cmdclass={"build_clib": BuildClib, "build_ext": BuildExt, "sdist": TranslatingSdist},
)
