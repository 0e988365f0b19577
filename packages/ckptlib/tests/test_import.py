import jaxstack.ckptlib


def test_public_api_names_exist():
    for name in jaxstack.ckptlib.__all__:
        assert hasattr(jaxstack.ckptlib, name), name
