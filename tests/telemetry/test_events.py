"""The event schema: construction from decoder stats, the dict/JSON round trip, and its value sets."""

import json
from typing import get_args

import pytest

from speccomplete.decoder import engine
from speccomplete.decoder.stats import GenerationStats
from speccomplete.telemetry.events import FINISH_REASONS, SCHEMA, CompletionEvent


def _event(**fields) -> CompletionEvent:
    stats = GenerationStats()
    stats.prompt_tokens, stats.new_tokens, stats.total_ms = 12, 5, 40.0
    stats.record_round(4, 2)
    stats.record_round(4, 4)
    return CompletionEvent.from_stats(stats.to_dict(), **({"language": "python", "target": "t", "draft": "d"} | fields))


def test_event_round_trips_through_dict_and_json():
    event = _event(settings={"gamma": "4", "temperature": 0.5}, case_id="py-0", source="bench", text="x = 1")
    back = CompletionEvent.from_dict(json.loads(json.dumps(event.to_dict())))
    assert back == event
    assert back.schema == SCHEMA == 1


def test_from_stats_maps_the_decoder_stats():
    event = _event()
    assert (event.prompt_tokens, event.generated_tokens, event.total_ms) == (12, 5, 40.0)
    assert (event.drafted, event.accepted, event.rounds, event.rejected_rounds) == (8, 6, 2, 1)
    assert event.lookup_rejected_rounds == 0
    stats = GenerationStats()
    stats.record_round(3, 1, lookup=True)  # a lookup copy that lost a round
    copied = CompletionEvent.from_stats(stats.to_dict(), source="study")
    assert (copied.lookup_drafted, copied.lookup_rejected_rounds, copied.rejected_rounds) == (3, 1, 1)
    assert event.gammas == [4, 4] and event.accepted_histogram == [0, 0, 1, 0, 1]
    assert event.text is None and event.outcome == "shown"  # no source text unless the caller opts in
    assert "alpha" not in event.to_dict()  # derived numbers are recomputed by the analysis, pooled


def test_an_event_written_before_lookup_rejected_rounds_existed_loads():
    old = _event().to_dict()
    del old["lookup_rejected_rounds"]
    assert CompletionEvent.from_dict(old).lookup_rejected_rounds == 0


def test_from_dict_rejects_newer_schema_unknown_fields_and_bad_values():
    with pytest.raises(ValueError, match="newer"):
        CompletionEvent.from_dict({"schema": SCHEMA + 1})
    with pytest.raises(ValueError, match="unknown"):
        CompletionEvent.from_dict({"schema": SCHEMA, "colour": "red"})
    with pytest.raises(ValueError, match="outcome"):
        CompletionEvent(outcome="liked")
    with pytest.raises(ValueError, match="trigger"):
        CompletionEvent(trigger="sometimes")


def test_finish_reasons_cover_the_decoders():
    """Telemetry keeps its own list (it never imports the decoder): every reason the decoder gives is on it."""
    assert set(get_args(engine.FinishReason)) <= set(FINISH_REASONS)
    assert {"", "reused"} <= set(FINISH_REASONS)  # nothing decoded; served again without decoding (the server)
