"""The agent: runs on every node, samples processes and GPUs, streams batches to the collector."""
