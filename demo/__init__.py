"""Demo workload pieces: the stand-in LLM engine used by tests, benchmarks and `make run`."""
