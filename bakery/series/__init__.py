"""The series: the diff format, the hunk engine, apply, series.toml and stages.toml."""
