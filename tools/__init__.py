"""Maintainer tools, run from the repo root as `python -m tools.<name>`: not installed, never run by users."""
