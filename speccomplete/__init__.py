"""speccomplete: code completion from a language server with a speculative decoder.

The one installed namespace. Its subpackages live in the repo's top-level folders and are mapped
here at install time (pyproject.toml, [tool.setuptools.package-dir]):

- speccomplete.decoder    <- decoder/     the speculative decoder (runtime), drafts, training
- speccomplete.server     <- server/      the language server and the completion pipeline
- speccomplete.telemetry  <- telemetry/   completion events, the event log, the offline analysis
- speccomplete.harness    <- harness/  benchmarks, evaluation, sweeps, cases
- speccomplete.cli        the `specdec` command (also `python -m speccomplete`)
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("speccomplete")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "(not installed)"
