"""What `clusterwatch status` and `jobs` print: a job's report and the jobs' list, from the query API's views.

text.py holds the primitives every command that prints user text uses (printable, fit, tables);
job.py assembles the report from its sections (usage, alerts, health, requests, code, notes).
"""
from .job import render
from .jobs import render_jobs

__all__ = ["render", "render_jobs"]
