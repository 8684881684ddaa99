"""`benchmarks.kernel_categories`: kernel names land in the category that does that work, and the
table divides launches and time by the steps."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from torch.autograd import DeviceType

from benchmarks.kernel_categories import KernelRow, categorize, category_table, kernel_rows


@pytest.mark.parametrize(
    ("name", "category"),
    [
        ("_skinny_kernel", "matmul"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "matmul"),
        ("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", "matmul"),
        ("sm90_xmma_fprop_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc", "convolution"),
        ("cudnn::detail::dgrad2d_alg1_1", "convolution"),
        ("_paged_decode_split_kernel", "attention"),
        ("_frame_attention_kernel", "attention"),
        ("_add_rms_norm_kernel", "norm/rotary"),
        ("_topk_sample_kernel", "sampling"),
        ("_snake_beta_kernel", "elementwise"),
        ("void at::native::vectorized_elementwise_kernel<4, ...>", "elementwise"),
        ("Memcpy DtoH (Device -> Pinned)", "copy"),
        ("void at::native::index_elementwise_kernel", "elementwise"),
        ("_combine_kernel", "attention"),
        ("_sum_splits_kernel", "matmul"),
        ("cublasLt::splitKreduce_kernel", "matmul"),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop", "attention"),
        ("void at::native::convert_kernel", "other"),  # not a convolution
        ("tensor_kernel_scan_innermost_dim", "sampling"),
        ("some_new_kernel", "other"),
    ],
)
def test_names_land_in_their_category(name, category):
    assert categorize(name) == category


def test_the_table_divides_by_steps_and_ranks_by_time():
    rows = [
        KernelRow("_skinny_kernel", 300, 1500.0),
        KernelRow("_frame_attention_kernel", 150, 750.0),
        KernelRow("_add_rms_norm_kernel", 300, 750.0),
        KernelRow("unused", 10, 0.0),  # no device time: left out
    ]
    table = category_table(rows, steps=10)
    lines = [ln for ln in table.splitlines() if ln.startswith("| ") and "---" not in ln][1:]
    assert lines[0] == "| matmul | 30.0 | 0.150 | 50.0% |"
    assert {ln.split(" | ")[0] for ln in lines[1:]} == {"| attention", "| norm/rotary"}
    assert "0.30 ms of kernel time" in table
    assert "other" not in table


@dataclass
class Event:
    key: str
    count: int
    self_device_time_total: float
    device_type: DeviceType
    is_user_annotation: bool = False


def test_only_device_events_are_counted():
    """A host op's self device time is its kernels' time, which the kernels' own rows carry:
    counting both would double every kernel (`aten::mm` over its gemm)."""
    rows = kernel_rows(
        [
            Event("aten::mm", 1, 10.0, DeviceType.CPU),
            Event("sm90_xmma_gemm_bf16", 1, 10.0, DeviceType.CUDA),
            Event("decode_step", 1, 50.0, DeviceType.CUDA, is_user_annotation=True),
        ]
    )
    assert rows == [KernelRow("sm90_xmma_gemm_bf16", 1, 10.0)]
