"""GPU health in the collector: the XID catalog (data) and the pure decisions of the health rules."""
