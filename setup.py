"""Build: Cython kernels in rmqstore/ linked with the C mmap layer in cext/.

cext/ is compiled once, into a static library every kernel links. A git checkout translates
the kernels with Cython; an sdist ships the generated C, so installing one needs no Cython. A
kernel whose built module in the source tree is newer than the files it is made from is
neither translated nor compiled again, so an editable install into a venv that has the build
(to add an extra, say) compiles nothing; build_backend.py then asks for neither numpy nor
Cython.
"""
import glob
import os
import shutil
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_clib import build_clib
from setuptools.command.build_ext import build_ext
from setuptools.command.sdist import sdist

from build_backend import FROM_SDIST, MODULES, built_in_tree, kernel_depends, kernel_source, translate_kernel

CEXT = sorted(glob.glob("cext/*.c"))
# -g0: no debug info in release builds (Python's CFLAGS carry -g); it doubled the objects' size
# and cost a fifth of the compile time. -O2, not -O3: against an -O3 build in the same quiet
# run (`rmqstore bench --no-peers --messages 1000000`, 3 runs each) no row was slower, and the
# kernels compile in about half the CPU time (52 s against ~95 s on 2 cores).
CFLAGS = ["-O2", "-g0", "-std=gnu11", "-Wno-unused-function"]
# Kernels are translated and compiled in parallel, one job per usable core.
JOBS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def kernel(name: str) -> Extension:
    """One kernel module: its Cython source (or, in an sdist, the C generated from it); numpy's
    headers are added when it is compiled (BuildExt.run)."""
    return Extension(
        f"rmqstore.{name}",
        [kernel_source(name)],
        include_dirs=["cext"],
        libraries=["rmqcext", "z"],   # cext first: it calls zlib
        depends=kernel_depends(),
        extra_compile_args=CFLAGS,
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    )


def translate(extensions: list[Extension], cython: Executor) -> dict[str, Future]:
    """Starts Cython's translation of each kernel (those whose C is older than their .pyx and
    .pxd files) in the worker processes of ``cython``; a future per kernel names its C. An
    sdist's kernels are built from the C it ships: nothing is started."""
    if FROM_SDIST:
        return {}
    return {ext.name: cython.submit(translate_kernel, ext.name, ext.sources[0]) for ext in extensions}


def point_at_c(ext: Extension, translations: dict[str, Future]) -> None:
    """Builds ``ext`` from its C, once the translation started for it is done."""
    if ext.name in translations:
        ext.sources = [translations[ext.name].result()]


def source_size(ext: Extension) -> int:
    """The size of the file the kernel is made from (0 for the shared module's C not yet made)."""
    path = Path(ext.sources[0])
    return path.stat().st_size if path.exists() else 0


def fresh(ext: Extension) -> Path | None:
    """The extension's module built in the source tree, if nothing it is made from is newer."""
    return built_in_tree(ext.name.rpartition(".")[2])


class BuildClib(build_clib):
    """Builds cext/'s static library, unless no kernel is to be compiled."""

    def run(self) -> None:
        build_ext_cmd = self.get_finalized_command("build_ext")
        if build_ext_cmd.force or not all(fresh(ext) for ext in self.distribution.ext_modules):
            super().run()


class BuildExt(build_ext):
    """build_ext that translates with Cython when building (not when pip reads setup.py to ask
    what the build needs, before Cython is there), and reuses a kernel already built in the
    source tree when it is newer than the project's files it is made from: an editable build
    runs in a fresh temporary directory, where every kernel would otherwise be translated and
    compiled again. Cython translates the stale kernels in JOBS worker processes, started
    before the C layer compiles, and each kernel is compiled as soon as its C is there, so
    translating and compiling overlap (translating all first left cores idle at the end of
    each phase)."""

    def finalize_options(self) -> None:
        super().finalize_options()
        self.parallel = self.parallel or JOBS   # setup(options=...) does not reach an editable build

    def run(self) -> None:
        stale = [ext for ext in self.extensions if self.force or fresh(ext) is None]
        if stale:   # numpy (like Cython) is in the build environment only when there is this work
            import numpy
            for ext in stale:
                ext.include_dirs.append(numpy.get_include())
        # The largest first, so that the last kernel compiled is a short one and no core waits
        # long for it (5 to 38 KB of Cython, 0.3 to 1.4 MB of C).
        self.extensions.sort(key=lambda ext: -source_size(ext))
        stale.sort(key=lambda ext: -source_size(ext))
        with ProcessPoolExecutor(JOBS) as cython:   # no process starts unless a kernel is stale
            self.translations = translate(stale, cython)   # goes on while the C layer compiles
            self.run_command("build_clib")   # `build` runs it first; `build_ext --inplace` alone does not
            super().run()

    def build_extension(self, ext: Extension) -> None:
        built = None if self.force else fresh(ext)
        target = Path(self.get_ext_fullpath(ext.name))
        if built is not None and built.resolve() != target.resolve():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(built, target)
            return
        point_at_c(ext, self.translations)
        super().build_extension(ext)


class TranslatingSdist(sdist):
    """An sdist carries the generated C, so installing it needs no Cython."""

    def run(self) -> None:
        with ProcessPoolExecutor(JOBS) as cython:
            translations = translate(self.distribution.ext_modules, cython)
            for ext in self.distribution.ext_modules:
                point_at_c(ext, translations)
        super().run()


setup(
    ext_modules=[kernel(name) for name in MODULES],
    # obj_deps: a header changed compiles the C layer again (build_clib looks at sources alone)
    libraries=[("rmqcext", {"sources": CEXT, "include_dirs": ["cext"], "cflags": CFLAGS,
                            "obj_deps": {"": sorted(glob.glob("cext/*.h"))}})],
    cmdclass={"build_clib": BuildClib, "build_ext": BuildExt, "sdist": TranslatingSdist},
)
