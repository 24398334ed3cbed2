"""The language groups the disparity report compares within: by default the resource groups of
speccomplete.languages (how much public code each language has), or groups given on the command line."""

from __future__ import annotations

from typing import get_args

from speccomplete.languages import LANGUAGES, Group

NATURAL_LANGUAGE = "nl"  # the language of prose cases (comments, docs): compared with code, never grouped
ALL_CODE = "all code"  # every language except natural language, grouped or not


def default_groups() -> dict[str, list[str]]:
    """{"high": [...], "medium": [...], "low": [...]}: each language's resource group."""
    return {group: [language.name for language in LANGUAGES if language.group == group] for group in get_args(Group)}


def parse_groups(specs: list[str] | None) -> dict[str, list[str]]:
    """["high=python,cpp", "low=zig"] (or one string joined by ';') -> {"high": [...], "low": [...]};
    the default groups when none are given."""
    if not specs:
        return default_groups()
    groups: dict[str, list[str]] = {}
    for spec in specs:
        for part in filter(None, (p.strip() for p in spec.split(";"))):
            name, sep, languages = part.partition("=")
            members = [x.strip() for x in languages.split(",") if x.strip()]
            if not sep or not name.strip() or not members:
                raise ValueError(f"group {part!r} must look like name=lang1,lang2")
            groups[name.strip()] = members
    return groups


def group_members(groups: dict[str, list[str]], languages: list[str]) -> dict[str, list[str]]:
    """Each group's members among `languages`, plus ALL_CODE."""
    members = {name: [lang for lang in langs if lang in languages] for name, langs in groups.items()}
    members[ALL_CODE] = [lang for lang in languages if lang != NATURAL_LANGUAGE]
    return members
