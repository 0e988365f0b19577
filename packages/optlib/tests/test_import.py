import jaxstack.optlib


def test_public_api_names_exist():
    for name in jaxstack.optlib.__all__:
        assert hasattr(jaxstack.optlib, name), name
