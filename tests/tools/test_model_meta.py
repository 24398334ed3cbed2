"""The packaged models' shipped metas (tools/model_meta.py) fit the GGUFs their installed packages hold, so a first
start converts in seconds; a package that changed its GGUF shows here before a user's slow first start does."""

import importlib.util

import pytest

from speccomplete.decoder.packaged import PACKAGED, shipped_meta
from tools import model_meta


@pytest.mark.parametrize("alias", list(PACKAGED))
def test_each_packaged_model_ships_a_meta_that_fits_its_gguf(alias):
    if importlib.util.find_spec(PACKAGED[alias].module) is None:
        pytest.skip(f"{PACKAGED[alias].package} is not installed")
    assert shipped_meta(alias) is not None, f"no shipped meta: python -m tools.model_meta {alias}"
    assert model_meta.fits(alias), f"built from another GGUF: python -m tools.model_meta {alias}"
