"""Ready callbacks that feed clusterwatch.train from training frameworks, imported only where installed."""
