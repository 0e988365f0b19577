import jaxstack.kernlib


def test_public_api_names_exist():
    for name in jaxstack.kernlib.__all__:
        assert hasattr(jaxstack.kernlib, name), name
