"""server/loading.py's load on the worker: token healing's table is begun after the load's last steps, and only
where healing is on and the backend has a tokenizer."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from speccomplete.server import loading
from speccomplete.server.options import ServerOptions


@pytest.mark.parametrize(
    ("healing", "tokenizer", "warmed"), [(True, "tok", True), (False, "tok", False), (True, None, False)]
)
def test_the_healing_table_is_begun_last_where_healing_is_on(monkeypatch, healing, tokenizer, warmed):
    said = []
    engine = SimpleNamespace(decoder="decoder", tokenizer=tokenizer)
    monkeypatch.setattr(loading, "load_engine", lambda options, progress: said.append("load") or engine)
    monkeypatch.setattr(loading, "wants_compiled_step", lambda setting, decoder: said.append("count") or True)
    monkeypatch.setattr(loading, "warm_up_healing", lambda tok: said.append(f"heal {tok}"))
    assert loading._load(ServerOptions(token_healing=healing), None) == (engine, True)
    assert said == (["load", "count", "heal tok"] if warmed else ["load", "count"])
