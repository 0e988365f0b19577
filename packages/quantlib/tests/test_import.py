import jaxstack.quantlib


def test_public_api_names_exist():
    for name in jaxstack.quantlib.__all__:
        assert hasattr(jaxstack.quantlib, name), name
