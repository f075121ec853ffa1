"""The native tracer (gpu_trace/native/gputrace.c) is built here with the system C compiler; the rest of the
package is pure Python (pyproject.toml). Optional: without a compiler the install succeeds and the tracer
falls back to cupti-python. No CUDA is needed to build it: libcupti is opened at run time."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("gpu_trace.native._gputrace", ["gpu_trace/native/gputrace.c"], optional=True,
                             extra_compile_args=["-O2", "-fvisibility=hidden"], libraries=["dl", "pthread"])])
