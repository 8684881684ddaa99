"""`benchmarks.after_trim`: the trim lands before exactly the requests counted as after one."""

from __future__ import annotations

from benchmarks.after_trim import measure
from omniflow.build.pipeline import build_pipeline
from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph


def test_each_trim_comes_right_before_a_trim_request():
    pipeline = build_pipeline(build_graph(compose(["platform=cpu", "pipeline.runtime=in_process"])))
    pipeline.start()
    order: list[str] = []
    submit = pipeline.submit

    def recording_submit(speech, sink, *args):
        order.append("request")
        return submit(speech, sink, *args)

    pipeline.submit = recording_submit
    try:
        got = measure(pipeline, 2, 2, lambda: order.append("trim"))
    finally:
        pipeline.stop()
    assert len(got["none"]) == len(got["trim"]) == 2
    assert all(ms > 0 for kind in got.values() for ms in kind)
    # three warm-ups, then none, trim, trim, none
    assert order == ["request"] * 4 + ["trim", "request", "trim", "request", "request"]
