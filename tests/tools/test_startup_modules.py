"""tools/startup_modules.py: the import profile's names, and where a wheel installs each module's source."""

from __future__ import annotations

from tools.startup_modules import installed_path, profiled_names, required_distributions


def test_names_come_from_the_import_profile_in_the_order_their_imports_ended():
    stderr = [
        "import time: self [us] | cumulative | imported package",
        "import time:       120 |        120 |     pkg.inner",
        "INFO speccomplete.server.lsp: a log line between them",
        "import time:       300 |        420 |   pkg",
    ]
    assert profiled_names(stderr) == ["pkg.inner", "pkg"]


def test_paths_are_where_a_wheel_puts_each_source(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "mod.py").write_text("")
    (tmp_path / "pkg" / "ext.so").write_text("")
    assert installed_path("pkg", tmp_path) == "pkg/__init__.py"
    assert installed_path("pkg.mod", tmp_path) == "pkg/mod.py"
    assert installed_path("pkg.ext", tmp_path) is None  # an extension module: nothing to compile
    # this checkout's modules, as the wheel lays them out, wherever the checkout is
    assert installed_path("speccomplete.server", tmp_path) == "speccomplete/server/__init__.py"
    assert installed_path("speccomplete.server.lsp", tmp_path) == "speccomplete/server/lsp.py"
    assert installed_path("__editable___speccomplete_0_1_0_finder", tmp_path) is None


def test_the_list_keeps_what_speccomplete_requires_and_not_this_environments_extras():
    required = required_distributions()
    assert {"speccomplete", "torch", "transformers", "sympy", "pygls"} <= required  # sympy: through torch
    assert not {"pytest", "scipy", "pandas"} & required  # the test and analysis extras
