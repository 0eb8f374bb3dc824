"""CUDA's int4 weight-only matmul (`_convert_weight_to_int4pack`, `_weight_int4pack_mm`), which
gpt-fast's int4 quantization and torchao's int4 weight-only tensors call on CUDA. The CPU build has
no kernel for either ("Could not run 'aten::_convert_weight_to_int4pack' with arguments from the
'CPU' backend"), so the emulated device failed where an H100 runs them. The packed layout is
checked against a loop that transcribes int4mm.cu's `matrix_to_m16n8k16_Bint4_layout` (its native
row is CUDA's own kernel against the same loop); the matmul against the dequantized weight. The
`cuda_kind` rows run natively on a GPU too."""

from __future__ import annotations

import pytest
import torch

GROUP = 64


def _quantized(n: int, k: int, seed: int = 0):
    """gpt-fast's tinygemm quantization of a random [n][k] weight: int4 values 0..15 with a
    scale and a zero per group of GROUP along k, packed two a byte (the even k high)."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), dtype=torch.int32, generator=generator)
    scales = torch.rand(k // GROUP, n, generator=generator) / 8 + 0.01
    zeros = torch.randn(k // GROUP, n, generator=generator) / 4
    scales_and_zeros = torch.stack((scales, zeros), dim=-1).to(torch.bfloat16)
    return q, (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8), scales_and_zeros


def _layout_by_the_kernels_loop(w_uint8: torch.Tensor, inner_k_tiles: int) -> torch.Tensor:
    n, half_k = w_uint8.shape
    out = torch.zeros(-(-n // 8), half_k * 2 // (inner_k_tiles * 16), 32, inner_k_tiles // 2,
                      dtype=torch.int64)
    for n_tile in range(out.size(0)):
        for k_outer in range(out.size(1)):
            for t in range(32):
                for inner in range(0, inner_k_tiles, 2):
                    row = n_tile * 8 + t // 4
                    base = (k_outer * inner_k_tiles + inner) * 8 + t % 4
                    v = [int(w_uint8[row, c]) if row < n else 0
                         for c in (base, base + 4, base + 8, base + 12)]
                    out[n_tile, k_outer, t, inner // 2] = (
                        (v[3] & 0xF) << 28 | (v[2] & 0xF) << 24 | (v[1] & 0xF) << 20
                        | (v[0] & 0xF) << 16 | (v[3] & 0xF0) << 8 | (v[2] & 0xF0) << 4
                        | (v[1] & 0xF0) | (v[0] & 0xF0) >> 4)
    return torch.where(out >= 2 ** 31, out - 2 ** 32, out).to(torch.int32)


def _dequantized(q: torch.Tensor, scales_and_zeros: torch.Tensor) -> torch.Tensor:
    groups = torch.arange(q.size(1)) // GROUP
    scale = scales_and_zeros[groups, :, 0].t().float()
    zero = scales_and_zeros[groups, :, 1].t().float()
    return ((q - 8).float() * scale + zero).to(torch.bfloat16)


def _close(y: torch.Tensor, expected: torch.Tensor) -> bool:
    # bfloat16 output, accumulated in float32 in an order of CUDA's choosing
    return torch.allclose(y.cpu().float(), expected.float(), rtol=2e-2, atol=5e-2)


@pytest.mark.parametrize("inner_k_tiles", [2, 4, 8])
def test_the_packed_weight_is_cudas_tensor_core_layout(cuda_kind, inner_k_tiles):
    _, w_uint8, _ = _quantized(24, 256)  # 24 rows: three whole n-tiles; the loop pads past n
    packed = torch.ops.aten._convert_weight_to_int4pack(w_uint8.to("cuda"), inner_k_tiles)
    assert packed.is_cuda and packed.dtype == torch.int32
    assert torch.equal(packed.cpu(), _layout_by_the_kernels_loop(w_uint8, inner_k_tiles))


def test_a_row_count_off_the_n_tile_is_padded_with_zeros(cuda_kind):
    _, w_uint8, _ = _quantized(20, 128)
    packed = torch.ops.aten._convert_weight_to_int4pack(w_uint8.to("cuda"), 2)
    assert packed.shape == (3, 4, 32, 1)
    assert torch.equal(packed.cpu(), _layout_by_the_kernels_loop(w_uint8, 2))


def test_the_int4_matmul_dequantizes_each_group(cuda_kind):
    q, w_uint8, scales_and_zeros = _quantized(32, 256)
    packed = torch.ops.aten._convert_weight_to_int4pack(w_uint8.to("cuda"), 8)
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    y = torch._weight_int4pack_mm(x.to("cuda"), packed, GROUP, scales_and_zeros.to("cuda"))
    assert y.is_cuda and y.dtype == torch.bfloat16 and y.shape == (5, 32)
    assert _close(y, x.float() @ _dequantized(q, scales_and_zeros).float().t())


def test_a_captured_int4_matmul_replays_each_new_activation(cuda_kind):
    q, w_uint8, scales_and_zeros = _quantized(32, 256)
    weight = _dequantized(q, scales_and_zeros).float()
    packed = torch.ops.aten._convert_weight_to_int4pack(w_uint8.to("cuda"), 8)
    info = scales_and_zeros.to("cuda")
    x = torch.zeros(4, 256, dtype=torch.bfloat16, device="cuda")
    warmup = torch.cuda.Stream()
    warmup.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warmup):
        torch._weight_int4pack_mm(x, packed, GROUP, info)
    torch.cuda.current_stream().wait_stream(warmup)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = torch._weight_int4pack_mm(x, packed, GROUP, info) * 2
    for seed in (2, 3):
        new_x = torch.randn(4, 256, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
        x.copy_(new_x.to("cuda"))
        graph.replay()
        assert _close(y, 2 * (new_x.float() @ weight.t()))


def test_a_compiled_int4_matmul_gives_the_eager_answer(cuda_kind):
    q, w_uint8, scales_and_zeros = _quantized(32, 256)
    packed = torch.ops.aten._convert_weight_to_int4pack(w_uint8.to("cuda"), 8)
    info = scales_and_zeros.to("cuda")

    def linear(x):
        return torch.ops.aten._weight_int4pack_mm(x, packed, GROUP, info) + 1

    x = torch.randn(4, 256, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16).to("cuda")
    assert _close(torch.compile(linear)(x), linear(x).cpu())


def test_the_packing_checks_its_input_as_cudas_kernel_does(cuda_kind):
    _, w_uint8, _ = _quantized(8, 128)
    with pytest.raises(RuntimeError, match=r"innerKTiles == 2 \|\| innerKTiles == 4"):
        torch.ops.aten._convert_weight_to_int4pack(w_uint8.to("cuda"), 3)
    with pytest.raises(RuntimeError, match=r"kByte"):
        torch.ops.aten._convert_weight_to_int4pack(w_uint8.to(torch.int32).to("cuda"), 2)
