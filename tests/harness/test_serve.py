"""`specdec serve` converts ahead the packaged model its editor's `initialize` names (harness/serve.py): the default
where the settings name none, nothing for another backend or a setting of the wrong type."""

from __future__ import annotations

import logging

import pytest

from speccomplete.decoder import packaged
from speccomplete.harness import serve


@pytest.mark.parametrize(
    ("settings", "converted"),
    [
        ({}, [packaged.DEFAULT_TARGET]),
        ({"target": "smollm2-135m", "debounceMs": 0}, ["smollm2-135m"]),
        ({"backend": "local", "target": "/models/mine"}, ["/models/mine"]),  # convert_ahead passes over a path
        ({"backend": "llamacpp"}, []),
        ({"target": 3}, []),  # the server reports the setting; nothing to convert
    ],
)
def test_the_model_converted_ahead_is_the_one_the_settings_name(settings, converted, monkeypatch):
    asked = []
    monkeypatch.setattr(packaged, "convert_ahead", asked.append)
    serve.convert_model_ahead(settings)
    assert asked == converted


def test_a_conversion_that_cannot_start_is_logged_and_left_to_the_load(monkeypatch, caplog):
    """On the stdin thread nothing may escape: a package whose GGUF cannot be assembled is the load's to convert."""

    def cannot(target):
        raise OSError("a chunk of the package is missing")

    monkeypatch.setattr(packaged, "convert_ahead", cannot)
    with caplog.at_level(logging.WARNING, logger="speccomplete.harness.serve"):
        serve.convert_model_ahead({})
    assert f"converting {packaged.DEFAULT_TARGET} ahead: a chunk of the package is missing" in caplog.text
