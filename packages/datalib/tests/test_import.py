import importlib.metadata
import re

import jaxstack.datalib


def test_public_api_names_exist():
    for name in jaxstack.datalib.__all__:
        assert hasattr(jaxstack.datalib, name), name


def test_importing_datalib_does_not_import_jax():
    import subprocess
    import sys

    # lm_batches loads the pipeline modules, and with them Grain
    code = "import sys, jaxstack.datalib as dl; dl.lm_batches; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_declared_dependencies_do_not_include_jax():
    requirements = importlib.metadata.requires("jaxstack-datalib") or []
    names = {re.split(r"[<>=!~; \[]", r, maxsplit=1)[0].lower() for r in requirements}
    assert not names & {"jax", "jaxlib"}


def test_tokenizers_and_templates_need_no_grain_and_pipelines_name_the_extra():
    import subprocess
    import sys

    # Grain is the `grain` extra: without it, what the model server uses still works.
    code = """
import sys
sys.modules["grain"] = None
import jaxstack.datalib as dl
print(dl.ByteTokenizer().decode(dl.ByteTokenizer().encode("hi")))
print(dl.ChatTemplate("{{ messages[0]['content'] }}").render([{"role": "user", "content": "ok"}]))
try:
    dl.lm_batches
except ModuleNotFoundError as e:
    print(e)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [
        "hi",
        "ok",
        "datalib's input pipelines (lm_batches, pack, mixture, ...) need Grain: "
        "pip install 'jaxstack-datalib[grain]'",
    ]
