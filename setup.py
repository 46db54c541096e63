"""The optional C++ engine; everything else about the package is in pyproject.toml."""
import warnings

from glob import glob

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """The C++ engine is an accelerator: without it the numpy path gives identical bytes."""

    def run(self):
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any compiler failure falls back to numpy
            warnings.warn(f"C++ engine not built ({exc}); the numpy path will be used")

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001
            warnings.warn(f"C++ engine not built ({exc}); the numpy path will be used")


setup(
    ext_modules=[Extension("deepreduce_hvd._native", sorted(glob("csrc/*.cpp")), language="c++",
                           depends=sorted(glob("csrc/*.h")),
                           extra_compile_args=["-O3", "-std=c++17", "-pthread"],
                           extra_link_args=["-pthread"])],
    cmdclass={"build_ext": OptionalBuildExt},
)
