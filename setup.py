"""The optional C extension (everything else is in pyproject.toml).

``ezflow._core._speedups`` compiles the codec's small-message encode
(ezflow/_core/_speedups.c). It is optional: without a C compiler the build of the
extension fails quietly, the install succeeds, and ezflow runs its pure-Python path
(``ezflow --version`` says which path is active; docs/architecture.md, "The compiled
hot path").
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "ezflow._core._speedups",
            ["ezflow/_core/_speedups.c"],
            optional=True,
            extra_compile_args=["-O2", "-Wall", "-Wextra"] if __import__("os").name != "nt" else [],
        )
    ]
)
