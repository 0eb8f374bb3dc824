"""CUDA's int4 weight-only matmul ("tinygemm") for device tensors: `_convert_weight_to_int4pack`
and `_weight_int4pack_mm`, which gpt-fast's int4 quantization and torchao's int4 weight-only layout
call and which the CPU build has for CUDA's layout only under other names.

`_convert_weight_to_int4pack` writes CUDA's tensor-core layout bit for bit (int4mm.cu's
`matrix_to_m16n8k16_Bint4_layout`, the NVIDIA path): from `[n][k / 2]` uint8 (two int4 values a
byte, the even k in the high nibble) to `[ceil(n / 8)][k / (innerKTiles * 16)][32][innerKTiles /
2]` int32, so a packed weight saved from a GPU means the same here. `_weight_int4pack_mm` unpacks
it and computes as the kernel does: each int4 value dequantized as `(q - 8) * scale + zero` in
bfloat16 with the scale and zero of its group (`qScaleAndZeros[k / qGroupSize][n][2]`), then a
bfloat16 matmul accumulated in float32. Both check their inputs as CUDA's kernels do, in torch's
words.

While the emulation lasts each op gets a CPU kernel of the harness's (in a Library of its own,
destroyed at exit; an op that has a CPU kernel of its own in some build keeps it). The kernel runs
below the dispatch modes, as CUDA's C++ kernel does: eager calls, a capture (one recorded op, run
again at each replay) and compiled code (inductor calls the op as an extern kernel) all reach it.
Different from CUDA, as for the routed custom ops (custom_ops.py): host tensors given to these ops
run the kernel too, where CUDA finds none for them."""

from __future__ import annotations

import torch

from harness import torch_internals

Tensor = torch.Tensor

_N_TILE = 8  # CUDA's n-tile of the packed tensor's first dimension
_K_TILE = 16
_LANES = 32


def _check(condition: bool, text: str) -> None:
    if not condition:
        raise RuntimeError(text)


def _lane_bytes(n_tiles: int, k_super_tiles: int, inner_k_tiles: int, device) -> tuple[Tensor, list[Tensor]]:
    """Which byte of the `[n][k / 2]` input each nibble group of the packed tensor holds: the row
    index (broadcast as [n_tiles, 1, 32, 1]) and the four byte columns v[0..3] (broadcast as
    [1, k_super_tiles, 32, inner_k_tiles / 2]), as the layout kernel's lane `t` loads them."""
    lane = torch.arange(_LANES, device=device).view(1, 1, _LANES, 1)
    rows = torch.arange(n_tiles, device=device).view(n_tiles, 1, 1, 1) * _N_TILE + lane // 4
    outer = torch.arange(k_super_tiles, device=device).view(1, k_super_tiles, 1, 1)
    inner = torch.arange(0, inner_k_tiles, 2, device=device).view(1, 1, 1, inner_k_tiles // 2)
    base = (outer * inner_k_tiles + inner) * (_K_TILE // 2) + lane % 4
    return rows, [base, base + 4, base + _K_TILE // 2, base + _K_TILE // 2 + 4]


def convert_weight_to_int4pack(self: Tensor, innerKTiles: int) -> Tensor:
    """CUDA's `_convert_weight_to_int4pack(Tensor self, int innerKTiles)`."""
    _check(self.dim() == 2, "Expected in.dim() == 2 to be true, but got false.")
    _check(self.dtype == torch.uint8, "Expected in.dtype() == at::kByte to be true, but got false.")
    _check(self.is_contiguous(), "Expected in.is_contiguous() to be true, but got false.")
    _check(innerKTiles in (2, 4, 8), "Expected innerKTiles == 2 || innerKTiles == 4 || "
                                     "innerKTiles == 8 to be true, but got false.")
    n, half_k = self.shape
    k = 2 * half_k
    _check(k % (innerKTiles * _K_TILE) == 0 and k >= innerKTiles * _K_TILE,
           "Expected isEvenDivisor(in.size(1) * 2, innerKTiles * kKTileSize) to be true, but got false.")
    n_tiles = -(-n // _N_TILE)
    k_super_tiles = k // (innerKTiles * _K_TILE)
    padded = torch.zeros(n_tiles * _N_TILE, half_k, dtype=torch.int64, device=self.device)
    padded[:n] = self.to(torch.int64)
    rows, columns = _lane_bytes(n_tiles, k_super_tiles, innerKTiles, self.device)
    v = [padded[rows, c] for c in columns]
    packed = (((v[3] & 0xF) << 28) | ((v[2] & 0xF) << 24) | ((v[1] & 0xF) << 20)
              | ((v[0] & 0xF) << 16) | ((v[3] & 0xF0) << 8) | ((v[2] & 0xF0) << 4)
              | (v[1] & 0xF0) | ((v[0] & 0xF0) >> 4))
    packed = torch.where(packed >= 2 ** 31, packed - 2 ** 32, packed)  # the int32 bits
    return packed.to(torch.int32)


def _unpack(packed: Tensor, n: int, k: int) -> Tensor:
    """The int4 values `[n][k]` (0 to 15) that `convert_weight_to_int4pack` packed."""
    n_tiles, k_super_tiles, _, half_inner = packed.shape
    bits = packed.to(torch.int64) & 0xFFFFFFFF
    nibble = [(bits >> shift) & 0xF for shift in range(0, 32, 4)]
    # byte v[i] was (high nibble at bit 4i) and (low nibble at bit 16 + 4i)
    v = [(nibble[i] << 4) | nibble[4 + i] for i in range(4)]
    rows, columns = _lane_bytes(n_tiles, k_super_tiles, half_inner * 2, packed.device)
    data = torch.zeros(n_tiles * _N_TILE, k // 2, dtype=torch.int64, device=packed.device)
    for value, column in zip(v, columns):
        data[rows, column] = value
    data = data[:n]
    return torch.stack((data >> 4, data & 0xF), dim=-1).reshape(n, k)


def weight_int4pack_mm(self: Tensor, mat2: Tensor, qGroupSize: int, qScaleAndZeros: Tensor) -> Tensor:
    """CUDA's `_weight_int4pack_mm(Tensor self, Tensor mat2, int qGroupSize, Tensor
    qScaleAndZeros)`: `self` `[m][k]` bfloat16, `mat2` packed by `convert_weight_to_int4pack`."""
    _check(self.device == mat2.device == qScaleAndZeros.device,
           "Expected A.device() == B.device() && A.device() == qScaleAndZeros.device() to be "
           "true, but got false.")
    _check(mat2.dim() == 4 and mat2.size(3) * 2 in (2, 4, 8),
           "Expected B_innerKTiles == 2 || B_innerKTiles == 4 || B_innerKTiles == 8 to be true, "
           "but got false.")
    _check(self.dtype == torch.bfloat16, "Expected A.dtype() == at::kBFloat16 to be true, but got false.")
    _check(self.is_contiguous(), "Expected A.is_contiguous() to be true, but got false.")
    _check(self.dim() == 2, "Expected A.dim() == 2 to be true, but got false.")
    _check(mat2.dtype == torch.int32, "Expected B.dtype() == at::kInt to be true, but got false.")
    _check(mat2.is_contiguous(), "Expected B.is_contiguous() to be true, but got false.")
    inner_k_tiles = mat2.size(3) * 2
    k = self.size(1)
    _check(mat2.size(1) == k // (inner_k_tiles * _K_TILE),
           "Expected B.size(1) == k / (B_innerKTiles * kKTileSize) to be true, but got false.")
    _check(mat2.size(2) == _LANES, "Expected B.size(2) == 32 to be true, but got false.")
    _check(qGroupSize in (32, 64, 128, 256), "Expected qGroupSize == 32 || qGroupSize == 64 || "
                                             "qGroupSize == 128 || qGroupSize == 256 to be true, "
                                             "but got false.")
    n = mat2.size(0) * _N_TILE
    k_padded = -(-k // _K_TILE) * _K_TILE
    _check(qScaleAndZeros.dim() == 3, "Expected qScaleAndZeros.dim() == 3 to be true, but got false.")
    _check(k_padded >= qGroupSize and k_padded % qGroupSize == 0,
           "Expected kTiles * kKTileSize >= qGroupSize && isEvenDivisor(kTiles * kKTileSize, "
           "qGroupSize) to be true, but got false.")
    _check(qScaleAndZeros.size(1) == n, "Expected qScaleAndZeros.size(1) == n to be true, but got false.")
    _check(qScaleAndZeros.size(2) == 2, "Expected qScaleAndZeros.size(2) == 2 to be true, but got false.")
    q = _unpack(mat2, n, k)  # [n][k]
    groups = torch.arange(k, device=self.device) // qGroupSize
    # The kernel reads the memory as bfloat16 pairs whatever the tensor's dtype says.
    needed = (k_padded // qGroupSize) * n * 2
    info = qScaleAndZeros.contiguous().flatten().view(torch.uint8).view(torch.bfloat16)[:needed]
    info = info.view(k_padded // qGroupSize, n, 2)
    scale = info[groups, :, 0].t().float()  # [n][k]
    zero = info[groups, :, 1].t().float()
    weight = ((q - 8).float() * scale + zero).to(torch.bfloat16)  # the kernel's bf16 fma
    return torch.mm(self.float(), weight.float().t()).to(torch.bfloat16)


_KERNELS = {"_convert_weight_to_int4pack": convert_weight_to_int4pack,
            "_weight_int4pack_mm": weight_int4pack_mm}


class Int4Kernels:
    """The CPU kernels that run CUDA's int4 ops on the emulated device's tensors."""

    def __init__(self) -> None:
        self._library = None
        self.registered: list[str] = []

    def register(self) -> None:
        for name, kernel in _KERNELS.items():
            qualname = f"aten::{name}"
            if not hasattr(torch.ops.aten, name) or \
                    torch_internals.dispatch_has_kernel_for_dispatch_key(qualname, "CPU"):
                continue
            if self._library is None:
                self._library = torch.library.Library("aten", "IMPL")
            self._library.impl(name, _below_the_modes(kernel), "CPU")
            self.registered.append(qualname)

    def close(self) -> None:
        if self._library is not None:
            self._library._destroy()
            self._library = None
        self.registered.clear()


def _below_the_modes(kernel):
    def run(*args, **kwargs):
        with torch_internals.DisableTorchFunction():  # a kernel's torch ops are no device calls
            return kernel(*args, **kwargs)

    return run


__all__ = ["Int4Kernels", "convert_weight_to_int4pack", "weight_int4pack_mm"]
