"""Keep Python dispatch modes reachable.

PyTorch includes the Python dispatch keys in the thread's key set when its dispatch-mode stack goes
from empty to one mode, and drops them when it empties again. An RAII key-set guard restores the
whole key set it found on entry when it exits: `torch.inference_mode()` and
`torch._C._AutoDispatchBelowADInplaceOrView()` do. So a mode pushed onto an empty stack inside such
a block (the emulated device's stream tracking starts at the first sign of asynchrony, wherever
that is) stays on the stack after the block while the keys are gone: no op reaches it, nor any mode
pushed later above it (a capture's recorder then records nothing). Called where the emulator
pushes a mode and before device work, this puts the keys back.
"""

from __future__ import annotations

import torch

from harness import torch_internals
_PYTHON = torch_internals.DISPATCH_KEY_PYTHON
_SNAPSHOT = torch_internals.DISPATCH_KEY_PYTHON_TLS_SNAPSHOT
_included = torch_internals.dispatch_tls_is_dispatch_key_included
_set_included = torch_internals.dispatch_tls_set_dispatch_key_included
_stack_length = torch_internals.len_torch_dispatch_stack


def keep_modes_reachable() -> None:
    """Include the Python dispatch keys again if modes are on the stack without them."""
    if not _included(_PYTHON) and _stack_length():
        _set_included(_PYTHON, True)
        _set_included(_SNAPSHOT, True)
