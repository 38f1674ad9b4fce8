"""What comes in from agents: the ingest stream, who is sending, and the checks a batch passes first."""
