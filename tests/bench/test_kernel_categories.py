"""`bench.kernel_categories`: kernel names land in the category that does that work, and the
table divides launches and time by the steps."""

from __future__ import annotations

import pytest

from omniflow.bench.kernel_categories import KernelRow, categorize, category_table


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
        KernelRow("aten::mm", 10, 0.0),  # a host op: no device time of its own
    ]
    table = category_table(rows, steps=10)
    lines = [ln for ln in table.splitlines() if ln.startswith("| ") and "---" not in ln][1:]
    assert lines[0] == "| matmul | 30.0 | 0.150 | 50.0% |"
    assert {ln.split(" | ")[0] for ln in lines[1:]} == {"| attention", "| norm/rotary"}
    assert "0.30 ms of kernel time" in table
    assert "other" not in table
