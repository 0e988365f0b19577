import jaxstack.nnlib


def test_public_api_names_exist():
    for name in jaxstack.nnlib.__all__:
        assert hasattr(jaxstack.nnlib, name), name
