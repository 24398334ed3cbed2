"""server/options.py: camelCase settings onto typed fields, checked by their types; unknown keys ignored, bad values
reported per key."""

from __future__ import annotations

import dataclasses
from typing import get_type_hints

from speccomplete.server.options import DEFAULT_DRAFT, ServerOptions, describe, models_changed, parse_options, structure
from speccomplete.server.prompt import DEFAULT_BUDGET_CHARS


def test_defaults():
    options, errors = parse_options(None)
    assert options == ServerOptions() and errors == []
    assert options.draft == DEFAULT_DRAFT and options.telemetry and not options.telemetry_text
    assert options.language_enabled("ocaml")


def test_camel_case_keys_map_to_fields():
    options, errors = parse_options(
        {
            "maxTokensSingleLine": 8,
            "debounceMs": 0,
            "telemetryPath": "/tmp/e.jsonl",
            "enabledLanguages": ["python", "rust"],
            "draftConfidence": 1,
            "gamma": "4",
        }
    )
    assert errors == []
    assert (options.max_tokens_single_line, options.debounce_ms, options.telemetry_path) == (8, 0, "/tmp/e.jsonl")
    assert options.enabled_languages == ("python", "rust") and options.draft_confidence == 1.0
    assert options.language_enabled("rust") and not options.language_enabled("go")


def test_unknown_keys_are_ignored():
    options, errors = parse_options({"futureSetting": True, "target": "smollm2-135m"})
    assert errors == [] and options.target == "smollm2-135m"


def test_bad_values_are_reported_and_keep_the_previous_value():
    base, _ = parse_options({"maxTokensSingleLine": 8})
    options, errors = parse_options(
        {
            "maxTokensSingleLine": "many",
            "telemetry": "yes",
            "gamma": "fast",
            "temperature": -1,
            "debounceMs": True,
            "enabledLanguages": "python",
            "draftConfidence": 2,
            "target": "",
            "draft": "ngram+ngram",
            "maxTokensMultiLine": 64,
        },
        base,
    )
    assert sorted(e.split(":")[0] for e in errors) == sorted(
        [
            "maxTokensSingleLine",
            "telemetry",
            "gamma",
            "temperature",
            "debounceMs",
            "enabledLanguages",
            "draftConfidence",
            "target",
            "draft",
        ]
    )
    assert options.max_tokens_single_line == 8 and options.max_tokens_multi_line == 64
    assert options.gamma == "heuristic" and options.telemetry is True and options.draft == DEFAULT_DRAFT


def test_settings_must_be_an_object():
    options, errors = parse_options(["not", "an", "object"])
    assert options == ServerOptions() and errors == ["settings must be an object, got list"]


def test_model_fields_decide_a_reload():
    base = ServerOptions()
    assert models_changed(base, parse_options({"draft": "ngram"}, base)[0])
    assert not models_changed(base, parse_options({"gamma": "2", "maxTokensMultiLine": 9}, base)[0])


def test_errors_name_the_key_and_what_its_type_expects():
    _, errors = parse_options(
        {
            "maxTokensSingleLine": 0,
            "debounceMs": -1,
            "temperature": "hot",
            "telemetry": 1,
            "draftConfidence": 1.5,
            "telemetryPath": "",
            "telemetrySource": "ci",
            "enabledLanguages": ["python", 3],
            "target": None,
            "gamma": "fast",
        }
    )
    assert sorted(errors) == sorted(
        [
            "maxTokensSingleLine: expected an integer in [1, 8192] (got 0)",
            "debounceMs: expected an integer in [0, 5000] (got -1)",
            "temperature: expected a number in [0, 10] (got 'hot')",
            "telemetry: expected true or false (got 1)",
            "draftConfidence: expected a number in [0, 1] (got 1.5)",
            "telemetryPath: expected a non-empty string, or null (got '')",
            "telemetrySource: expected 'editor' or 'eval' (got 'ci')",
            "enabledLanguages: expected a list of non-empty strings, or null (got ['python', 3])",
            "target: expected a non-empty string (got None)",
            "gamma: gamma must be an integer >= 0, 'heuristic[:START:MAX]' or 'cost[:C:V]', got 'fast' (got 'fast')",
        ]
    )


def test_values_are_converted_to_the_field_types():
    options, errors = parse_options(
        {"temperature": 1, "rejectAfterS": 3, "enabledLanguages": [], "telemetryPath": None, "telemetrySource": "eval"}
    )
    assert errors == []
    assert options.temperature == 1.0 and isinstance(options.temperature, float) and options.reject_after_s == 3.0
    assert options.enabled_languages == () and options.telemetry_path is None and options.telemetry_source == "eval"
    assert parse_options({"enabledLanguages": None}, options)[0].enabled_languages is None


def test_every_field_has_a_rule_its_default_passes():
    """A field type without a rule fails here, not on a client's setting."""
    types = get_type_hints(ServerOptions, include_extras=True)
    for field in dataclasses.fields(ServerOptions):
        assert describe(types[field.name])
        assert structure(field.default, types[field.name]) == field.default


def test_one_prompt_budget_default():
    assert ServerOptions().prompt_budget_chars == DEFAULT_BUDGET_CHARS


def test_a_mistyped_key_is_reported_and_an_unknown_one_ignored():
    options, errors = parse_options({"maxTokenSingleLine": 8, "someNewerSetting": 1})
    assert errors == ["maxTokenSingleLine: unknown setting (did you mean maxTokensSingleLine?)"]
    assert options == ServerOptions()
