"""Helpers shared by several test folders (tiny model builders beyond conftest's)."""
