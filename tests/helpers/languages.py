"""The languages the tests cover."""

from __future__ import annotations

from speccomplete.languages import LANGUAGES

# The 14 code languages of the report's resource groups (tests/server/test_language.py pins them)
CODE_LANGUAGES = frozenset(language.name for language in LANGUAGES if language.group)
