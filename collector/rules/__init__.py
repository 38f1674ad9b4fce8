"""Leak and stall rules: a pure engine run live by the collector and offline by `clusterwatch replay`."""
