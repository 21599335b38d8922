"""Build: Cython kernels in rmqstore/ linked with the C mmap layer in cext/."""
import os

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

CEXT = ["cext/rmq_mmap.c", "cext/rmq_guard.c", "cext/rmq_fault.c", "cext/rmq_crc.c"]
KERNELS = ["_gate", "_segment", "_record", "_message", "_read", "_columns", "_append", "_cq", "_index_file", "_index", "_index_check", "_verify",
           "_arrow", "_properties", "_pack", "_consume", "_reput"]

extensions = [
    Extension(
        f"rmqstore.{name}",
        [f"rmqstore/{name}.pyx", *CEXT],
        include_dirs=["cext", numpy.get_include()],
        libraries=["z"],
        extra_compile_args=["-O3", "-std=gnu11", "-Wno-unused-function"],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    )
    for name in KERNELS
]

# Kernels are translated and compiled in parallel, one job per usable core (pip builds the
# sdist this way too: the options below are build_ext's, as in a setup.cfg).
JOBS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1

setup(
    ext_modules=cythonize(
        extensions,
        compiler_directives={"language_level": 3, "embedsignature": True},
        nthreads=JOBS,
    ),
    options={"build_ext": {"parallel": JOBS}},
)
