"""Turning a resolved stage graph into a running pipeline: the build entry
(`build.pipeline.build_pipeline`), the arch registry and each model family's builders."""
