"""The pages' template engine: Jinja2 with autoescape on, so every value a page shows is escaped unless a
template marks it safe, and no page can forget one.

Templates live in templates/ beside this module (package data in the wheel). A value that reaches a page
through anything but a template (the page's own script) is a constant of this package.
"""
from __future__ import annotations

import functools
import time
from urllib.parse import quote

import jinja2


@functools.cache
def environment() -> jinja2.Environment:
    """The one Environment: templates from this package, escaped by default, a missing variable an error."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("clusterwatch.collector.web", "templates"),
        autoescape=jinja2.select_autoescape(("html", "svg"), default_for_string=True, default=True),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["when"] = when
    env.filters["job_href"] = job_href
    return env


def render(name: str, **context) -> str:
    """Template `name` (under templates/) filled with `context`."""
    return environment().get_template(name).render(**context)


def when(t: float) -> str:
    """A time as status prints it, with its zone; "-" for none."""
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(t)) if t else "-"


def job_href(job_id: str, tail: str = "") -> str:
    """The path of a job's page (its id quoted whole: an id may hold a slash or a question mark)."""
    return f"/jobs/{quote(job_id, safe='')}{tail}"
