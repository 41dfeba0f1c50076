"""The optional C extension (tarindex/_speedups.c, _batchio.c, _tarscan.c, _tarwalk.c, _tarcore.c, _zstdread.c, _resample.c); everything else is in pyproject.toml.

The extension is optional: where it cannot be compiled, tarindex installs
without it and TarDataset uses its pure-Python read path.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("tarindex._speedups", ["tarindex/_speedups.c", "tarindex/_batchio.c", "tarindex/_tarscan.c", "tarindex/_tarwalk.c", "tarindex/_tarcore.c", "tarindex/_zstdread.c", "tarindex/_resample.c", "tarindex/_exportfmt.c"], depends=["tarindex/_batchio.h", "tarindex/_tarscan.h", "tarindex/_tarwalk.h", "tarindex/_tarcore.h", "tarindex/_zstdread.h", "tarindex/_resample.h", "tarindex/_exportfmt.h"], libraries=["dl", "pthread"], optional=True, extra_compile_args=["-O2"])])
