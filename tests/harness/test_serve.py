"""`specdec serve` converts ahead the packaged model its editor's `initialize` names (harness/serve.py): the default
where the settings name none, nothing for another backend or a setting of the wrong type."""

from __future__ import annotations

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
