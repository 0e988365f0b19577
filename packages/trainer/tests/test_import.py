import jaxstack.trainer


def test_public_api_names_exist():
    for name in jaxstack.trainer.__all__:
        assert hasattr(jaxstack.trainer, name), name
