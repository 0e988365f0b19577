import jaxstack.rl


def test_public_api_names_exist():
    for name in jaxstack.rl.__all__:
        assert hasattr(jaxstack.rl, name), name
