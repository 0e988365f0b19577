import jaxstack.serving


def test_public_api_names_exist():
    for name in jaxstack.serving.__all__:
        assert hasattr(jaxstack.serving, name), name
