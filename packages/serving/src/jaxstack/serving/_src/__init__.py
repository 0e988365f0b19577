"""Private implementation of jaxstack.serving; the public API is `jaxstack.serving.__all__`."""
