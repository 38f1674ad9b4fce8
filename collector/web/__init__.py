"""The collector's web pages: `/` (the jobs) and `/jobs/ID` (one job, as `status` shows it, with charts).

Served on --web-listen from a thread of the collector (server.py); pages are built server-side
(pages.py, charts.py as SVG) from the core's views and history (history.py), for whoever access.py
lets see them. No script or style comes from elsewhere: the cluster may be offline.
"""
