"""The cluster's state, its history and the store: batches applied, jobs closed, what survives a restart."""
