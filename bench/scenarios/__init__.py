"""The report's scenarios: each `run(run: bench.record.Run)` measures its goals side by side,
repetition by repetition, and records values, plot series and CPU seconds into `run`."""
