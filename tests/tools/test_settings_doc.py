"""The settings tables are generated (tools/settings_doc.py): the committed pages must hold
what the definitions say now, and every server option must be reachable from VS Code."""

from __future__ import annotations

import dataclasses

import pytest

from speccomplete.server.options import HELP, ServerOptions, snake_to_camel
from tools import settings_doc

# what the editor never sets: the harness's own bookkeeping
NOT_FOR_EDITORS = {"telemetrySource", "trackOutcomes"}


def test_the_committed_tables_are_current(capsys):
    stale = settings_doc.main(["--check"])
    assert stale == 0, capsys.readouterr().err + " (rewrite: python -m tools.settings_doc)"


def test_every_server_option_has_help_and_a_vscode_setting():
    options = {snake_to_camel(f.name) for f in dataclasses.fields(ServerOptions)}
    assert {snake_to_camel(name) for name in HELP} == options
    passed_on = set(settings_doc.vscode_server_options().values())
    assert passed_on <= options, "settings.ts names an option the server does not have"
    assert options - passed_on == NOT_FOR_EDITORS


def test_render_replaces_only_between_the_markers():
    page = "a\n<!-- generated: t (x) -->\nold\n<!-- end generated: t -->\nb\n"
    assert settings_doc.render(page, "t", "new") == "a\n<!-- generated: t (x) -->\nnew\n<!-- end generated: t -->\nb\n"
    with pytest.raises(ValueError, match="markers"):
        settings_doc.render("no markers", "t", "new")
