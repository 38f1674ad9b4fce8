"""The collector: ingest, history, job registry, rules, alerts, store, exporter, query API."""
