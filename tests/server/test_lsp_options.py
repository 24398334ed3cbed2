"""server/options.py: camelCase settings onto typed fields; unknown keys ignored, bad values reported per key."""

from __future__ import annotations

from speccomplete.server.options import DEFAULT_DRAFT, ServerOptions, models_changed, parse_options


def test_defaults():
    options, errors = parse_options(None)
    assert options == ServerOptions() and errors == []
    assert options.draft == DEFAULT_DRAFT and options.telemetry and not options.telemetry_text
    assert options.language_enabled("ocaml")


def test_camel_case_keys_map_to_fields():
    options, errors = parse_options({"maxTokensSingleLine": 8, "debounceMs": 0, "telemetryPath": "/tmp/e.jsonl",
                                     "enabledLanguages": ["python", "rust"], "draftConfidence": 1, "gamma": "4"})
    assert errors == []
    assert (options.max_tokens_single_line, options.debounce_ms, options.telemetry_path) == (8, 0, "/tmp/e.jsonl")
    assert options.enabled_languages == ("python", "rust") and options.draft_confidence == 1.0
    assert options.language_enabled("rust") and not options.language_enabled("go")


def test_unknown_keys_are_ignored():
    options, errors = parse_options({"futureSetting": True, "target": "smollm2-135m"})
    assert errors == [] and options.target == "smollm2-135m"


def test_bad_values_are_reported_and_keep_the_previous_value():
    base, _ = parse_options({"maxTokensSingleLine": 8})
    options, errors = parse_options({"maxTokensSingleLine": "many", "telemetry": "yes", "gamma": "fast",
                                     "temperature": -1, "debounceMs": True, "enabledLanguages": "python",
                                     "draftConfidence": 2, "target": "", "maxTokensMultiLine": 64}, base)
    assert sorted(e.split(":")[0] for e in errors) == sorted(
        ["maxTokensSingleLine", "telemetry", "gamma", "temperature", "debounceMs", "enabledLanguages",
         "draftConfidence", "target"])
    assert options.max_tokens_single_line == 8 and options.max_tokens_multi_line == 64
    assert options.gamma == "heuristic" and options.telemetry is True


def test_settings_must_be_an_object():
    options, errors = parse_options(["not", "an", "object"])
    assert options == ServerOptions() and errors == ["settings must be an object, got list"]


def test_model_fields_decide_a_reload():
    base = ServerOptions()
    assert models_changed(base, parse_options({"draft": "ngram"}, base)[0])
    assert not models_changed(base, parse_options({"gamma": "2", "maxTokensMultiLine": 9}, base)[0])
