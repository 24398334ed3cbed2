"""What the tests share beyond fixtures (tests/conftest.py holds those): tiny models, tokenizers, checks on
decoding, LSP clients; on the path as `helpers` (pyproject.toml, [tool.pytest.ini_options])."""
