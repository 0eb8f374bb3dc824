"""Child Python processes inside the same emulation (`emulate_cuda(children=True)`, which
`--emulate-cuda` sets).

Code written for CUDA starts processes that use the device too: a `python -c` that checks an error
in a fresh interpreter, multiprocessing workers, a launcher's ranks. Each is its own interpreter, so
each gets its own emulated device, with the same options. The mechanism is Python's own: a
generated `sitecustomize.py` in a temporary folder put first on `PYTHONPATH` for the duration, so
that every child interpreter reads it at startup. It does nothing until the child imports torch
(a child that never does, such as pip, pays nothing), then enters the emulation once torch is
loaded. A `sitecustomize` of the user's that it hides is imported after it. An explicit
`emulate_cuda()` in the child takes the inherited one's place.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

_TEMPLATE = '''"""Written by harness.emulate_cuda(children=True) for the child processes of one running
inside the emulated CUDA device; removed when that emulation exits."""
import importlib.abc
import importlib.machinery
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_OPTIONS = {options!r}


def _enter():
    try:
        from harness.emulation.session import enter_inherited
    except ImportError as error:
        sys.stderr.write(f"harness: this child of an emulate_cuda() process cannot import the "
                         f"harness ({{error}}); it runs without the emulated device\\n")
        return
    enter_inherited(_OPTIONS)


class _AfterTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            _enter()

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _AfterTorch())
# The sitecustomize this one hides, if the user has one, run as it would have been.
_hidden = importlib.machinery.PathFinder.find_spec(
    "sitecustomize", [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE])
if _hidden is not None and _hidden.loader is not None:
    import importlib.util
    _hidden.loader.exec_module(importlib.util.module_from_spec(_hidden))
'''


def inherit_in_children(stack: contextlib.ExitStack, options: dict) -> str:
    """Make child interpreters enter `emulate_cuda(**options)` until `stack` closes; returns the
    folder of the generated sitecustomize."""
    folder = tempfile.mkdtemp(prefix="harness-emulate-cuda-")
    with open(os.path.join(folder, "sitecustomize.py"), "w") as f:
        f.write(_TEMPLATE.format(options=options))
    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = folder if not previous else folder + os.pathsep + previous

    def restore() -> None:
        entries = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p != folder]
        if entries and any(entries):
            os.environ["PYTHONPATH"] = os.pathsep.join(entries)
        else:
            os.environ.pop("PYTHONPATH", None)
        shutil.rmtree(folder, ignore_errors=True)

    stack.callback(restore)
    return folder
