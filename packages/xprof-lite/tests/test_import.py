import jaxstack.xprof_lite


def test_public_api_names_exist():
    for name in jaxstack.xprof_lite.__all__:
        assert hasattr(jaxstack.xprof_lite, name), name
