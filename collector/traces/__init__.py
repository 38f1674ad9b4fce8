"""A job's history as a trace, and replaying a trace through the rules."""
