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
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_clib import build_clib
from setuptools.command.build_ext import build_ext
from setuptools.command.sdist import sdist

from build_backend import FROM_SDIST, MODULES, SHARED, built_in_tree, kernel_depends, kernel_source

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


def translate(extensions: list[Extension]) -> None:
    """Points the kernels at their C, Cython translating each .pyx whose C is stale (a git
    checkout); an sdist's kernels are built from the C it ships."""
    if FROM_SDIST or not extensions:
        return
    from Cython.Build import cythonize  # asked for by build_backend.py only here

    made = cythonize(extensions, compiler_directives={"language_level": 3, "embedsignature": True}, nthreads=JOBS,
                     shared_utility_qualified_name=f"rmqstore.{SHARED}")
    for ext, translated in zip(extensions, made, strict=True):
        ext.sources = translated.sources


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
    compiled again."""

    def finalize_options(self) -> None:
        super().finalize_options()
        self.parallel = self.parallel or JOBS   # setup(options=...) does not reach an editable build

    def run(self) -> None:
        stale = [ext for ext in self.extensions if self.force or fresh(ext) is None]
        if stale:   # numpy (like Cython) is in the build environment only when there is this work
            import numpy
            for ext in stale:
                ext.include_dirs.append(numpy.get_include())
        translate(stale)
        # The largest C first, so that the last kernel compiled is a short one and no core waits
        # long for it (0.3 to 1.4 MB of C).
        self.extensions.sort(key=lambda ext: -os.path.getsize(ext.sources[0]))
        self.run_command("build_clib")   # `build` runs it first; `build_ext --inplace` alone does not
        super().run()

    def build_extension(self, ext: Extension) -> None:
        built = None if self.force else fresh(ext)
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
    ext_modules=[kernel(name) for name in MODULES],
    # obj_deps: a header changed compiles the C layer again (build_clib looks at sources alone)
    libraries=[("rmqcext", {"sources": CEXT, "include_dirs": ["cext"], "cflags": CFLAGS,
                            "obj_deps": {"": sorted(glob.glob("cext/*.h"))}})],
    cmdclass={"build_clib": BuildClib, "build_ext": BuildExt, "sdist": TranslatingSdist},
)
