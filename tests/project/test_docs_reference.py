"""The reference pages and how-tos say what the code has, and the reference says all of it.

- docs/commands.md has a section for every command, a row for every flag (and no other), with the
  code's default and variable, and the code's usage line;
- docs/metrics.md names every family the collector exports, and no page names a series it does not;
- every JSON key a page shows in a `--json` sample is one the schema (docs/json/clusterwatch.schema.json)
  has, and `status --json`'s key list is the schema's;
- every `clusterwatch` command line in a README, tutorial or how-to shell block names a real command and
  real flags, its `--help` runs, and the ones that can run here do;
- every config file and rules file a page shows loads as the program loads it;
- every link between the pages reaches a file, and a heading where it names one.
"""
from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from clusterwatch.cli.main import cli as cli_group

from clusterwatch import toml_file
from clusterwatch.config import SECTIONS, TOP_LEVEL
from tests.support.helpers import CLI, ROOT, clean_environ

DOCS = ROOT / "docs"
# the pages a person reads: the README, the docs' top level (reference, explanation), the how-tos
PAGES = sorted([ROOT / "README.md", *DOCS.glob("*.md"), *DOCS.glob("how-to/*.md")])
# where a reader is told to type commands
HOW_TO = sorted([ROOT / "README.md", DOCS / "tutorial.md", *DOCS.glob("how-to/*.md")])
UNSET = ("", None, ())


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _commands() -> dict[str, click.Command]:
    ctx = click.Context(cli_group)
    return {name: cli_group.get_command(ctx, name) for name in cli_group.list_commands(ctx)}


def _options(command: click.Command) -> list[click.Option]:
    return [p for p in command.params if isinstance(p, click.Option) and not p.hidden]


def _cells(row: str) -> list[str]:
    """A markdown table row's cells (a `\\|` inside a cell is a pipe, not a border)."""
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", row.strip())[1:-1]]


def _flags_in(cell: str) -> list[str]:
    """The option names a table cell or a code span shows: `--interval SECONDS` is --interval."""
    return [tok for span in re.findall(r"`([^`]+)`", cell) for tok in span.split()
            if re.fullmatch(r"--?[a-zA-Z][\w-]*", tok)]


# -- docs/commands.md -----------------------------------------------------------------------------------

def _command_sections() -> dict[str, str]:
    text = (DOCS / "commands.md").read_text()
    parts = re.split(r"^## `clusterwatch ([a-z-]+)`\n", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def _rows(section: str) -> list[list[str]]:
    return [_cells(line) for line in section.splitlines() if line.startswith("| `-")]


def test_the_reference_has_a_section_for_every_command_and_no_other():
    assert sorted(_command_sections()) == sorted(_commands())


@pytest.mark.parametrize("name", sorted(_commands()))
def test_the_reference_lists_every_flag_of_a_command_and_no_other(name):
    command = _commands()[name]
    section = _command_sections()[name]
    documented = [flag for row in _rows(section) for flag in _flags_in(row[0])]
    real = [o for p in _options(command) for o in (*p.opts, *p.secondary_opts)]
    assert sorted(documented) == sorted(set(documented)), f"{name}: a flag listed twice"
    assert not set(documented) - set(real), f"docs/commands.md names flags `{name}` does not have: " \
        f"{sorted(set(documented) - set(real))}"
    assert not set(real) - set(documented), f"docs/commands.md lacks flags of `{name}`: " \
        f"{sorted(set(real) - set(documented))}"


def _default_text(option: click.Option) -> str | None:
    """The default column as the reference writes it; None where the code's default is computed at run
    time (the reference says it in words)."""
    value = option.default
    if option.is_flag and not option.count:
        return "on" if value is True else "off"
    if value is None:  # an address applied at run time: where the help names it, the reference shows it too
        said = re.search(r"\bdefault:? `?(\d+\.\d+\.\d+\.\d+:\d+)", option.help or "")
        return said.group(1) if said else None
    if value in UNSET or repr(value) == "Sentinel.UNSET":
        return None
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


@pytest.mark.parametrize("name", sorted(_commands()))
def test_the_reference_gives_each_flag_its_default_and_variable(name):
    by_flag = {o: p for p in _options(_commands()[name]) for o in p.opts}
    wrong = []
    for row in _rows(_command_sections()[name]):
        option = by_flag.get(_flags_in(row[0])[0])
        if option is None:  # not a flag of the command: the test above says so
            continue
        default, variable = row[1].strip("`"), row[2].strip("`")
        expected = _default_text(option)
        if expected is not None and default != expected:
            wrong.append(f"{option.opts[-1]}: default {default!r}, the code's is {expected!r}")
        if expected is None and default not in ("—",):
            wrong.append(f"{option.opts[-1]}: default {default!r}, the code sets none (say it in words)")
        envvar = option.envvar if isinstance(option.envvar, str) else "—"
        if variable != envvar:
            wrong.append(f"{option.opts[-1]}: variable {variable!r}, the code's is {envvar!r}")
    assert not wrong, f"docs/commands.md, clusterwatch {name}: {wrong}"


@pytest.mark.parametrize("name", sorted(_commands()))
def test_the_reference_shows_the_usage_line_of_the_code(name):
    command = _commands()[name]
    ctx = click.Context(command, info_name=name, parent=click.Context(cli_group, info_name="clusterwatch"))
    usage = f"clusterwatch {name} " + " ".join(command.collect_usage_pieces(ctx))
    assert f"```\n{usage}\n```" in _command_sections()[name]


def test_the_reference_names_the_options_of_clusterwatch_itself():
    text = (DOCS / "commands.md").read_text().split("\n## ", 1)[0]
    documented = {flag for line in text.splitlines() if line.startswith("| `-") for flag in _flags_in(line)}
    real = {o for p in cli_group.params for o in p.opts}
    real |= set(cli_group.get_help_option_names(click.Context(cli_group, **cli_group.context_settings)))
    assert documented == real


# -- metrics ---------------------------------------------------------------------------------------------

def _exported() -> set[str]:
    """Every series name the collector can export, as a scrape writes it (counters end in _total)."""
    from clusterwatch.collector.export import families as f
    from clusterwatch.collector.export.action_families import ACTIONS
    from clusterwatch.collector.export.counter_metrics import COUNTERS
    from clusterwatch.collector.export.offender_families import OFFENDER_FAMILIES
    from clusterwatch.collector.health.metrics import HEALTH_FAMILIES

    fams = [f.JOB_INFO, f.JOB_CODE, *f.JOB_FAMILIES, *f.JOB_COST_FAMILIES, *f.RANK_FAMILIES, *f.PROCESS_FAMILIES,
            *f.GPU_FAMILIES, *f.ACTIVITY_FAMILIES, *f.NODE_FAMILIES, f.ALERT_FAMILY, *HEALTH_FAMILIES,
            ACTIONS, *OFFENDER_FAMILIES]
    return {fam.sample_name for fam in fams} | {f"{name}_total" for name, _ in COUNTERS.values()}


METRIC = re.compile(r"\bclusterwatch_[a-z0-9_]*[a-z0-9](?![\w…*])")


def test_the_metrics_reference_names_every_exported_series():
    text = (DOCS / "metrics.md").read_text()
    in_tables = {m.group(0) for line in text.splitlines() if line.startswith("|")
                 for m in METRIC.finditer(_cells(line)[0] if _cells(line) else "")}
    assert sorted(_exported() - in_tables) == [], "docs/metrics.md lacks these series"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_a_page_names_only_series_the_collector_exports(page):
    exported = _exported()
    # a family may be named as OpenMetrics does, without the counter's _total or the info's _info
    known = exported | {re.sub(r"_(total|info)$", "", name) for name in exported}
    named = {m.group(0) for m in METRIC.finditer(page.read_text())}
    assert sorted(named - known) == [], f"{_rel(page)} names series the collector does not export"


# -- JSON keys -------------------------------------------------------------------------------------------

SCHEMA = json.loads((DOCS / "json" / "clusterwatch.schema.json").read_text())
SCHEMA_KEYS = {key for d in SCHEMA["$defs"].values() for key in d.get("properties", {})}


def _blocks(page: Path) -> list[tuple[str, str]]:
    """The fenced blocks of a page: (language, text)."""
    return re.findall(r"^```(\w*)\n(.*?)^```", page.read_text(), flags=re.M | re.S)


@pytest.mark.parametrize("page", [p for p in PAGES if p.name != "traces.md"], ids=_rel)
def test_the_json_samples_of_a_page_hold_only_keys_the_schema_has(page):
    # docs/traces.md shows the trace format, which is not a --json document
    unknown = set()
    for _, text in _blocks(page):
        if re.search(r"^\s*\{", text, flags=re.M) and '":' in text:
            unknown |= set(re.findall(r'"([a-z_][a-z0-9_]*)"\s*:', text)) - SCHEMA_KEYS
    assert not unknown, f"{_rel(page)}: JSON keys no --json document has: {sorted(unknown)}"


def test_the_status_how_to_lists_the_keys_of_status_json():
    text = " ".join((DOCS / "how-to" / "read-status.md").read_text().split())
    listed = re.search(r"Its keys are (.*?) and `now`", text).group(1)
    keys = set(re.findall(r"`([a-z_]+)`", listed)) | {"now"}
    assert keys == set(SCHEMA["$defs"]["status_document"]["properties"])


# -- shell blocks ----------------------------------------------------------------------------------------

def _command_lines(page: Path) -> list[str]:
    """The `clusterwatch ...` commands in a page's shell blocks (sh blocks, or `$ ` lines of samples), and
    those its prose shows in a code span."""
    prose = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    found = [" ".join(span.split()) for span in re.findall(r"`(clusterwatch [a-z][^`]*)`", prose)
             if span.split()[1] in _commands()]
    for lang, text in _blocks(page):
        text = re.sub(r"\$\([^)]*\)", "SUBST", text.replace("\\\n", " "))
        for line in text.splitlines():
            if lang not in ("sh", "bash") and not line.startswith("$ "):
                continue
            line = line.removeprefix("$ ").split("#", 1)[0]
            for part in re.split(r"&&|;|\||&", line):
                words = part.split()
                while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # VAR=value before the command
                    words.pop(0)
                if words and words[0].endswith("clusterwatch") and len(words) > 1:
                    found.append(" ".join(words))
    return found


SHOWN = [(page, line) for page in HOW_TO for line in _command_lines(page)]


def test_the_how_tos_show_commands():
    assert len(SHOWN) > 20  # the parser above finds them: a change of the blocks' shape must not hide them


@pytest.mark.parametrize(("page", "line"), SHOWN, ids=[f"{_rel(p)}: {line[:60]}" for p, line in SHOWN])
def test_a_shown_command_exists_with_the_flags_it_names(page, line):
    words = shlex.split(line.replace("[", " ").replace("]", " "))
    name = words[1]
    commands = _commands()
    assert name in commands, f"{_rel(page)}: `{line}`: no command {name!r}"
    real = {o for p in commands[name].params for o in (*p.opts, *getattr(p, "secondary_opts", []))}
    real |= {o for p in cli_group.params for o in p.opts}
    real |= set(cli_group.get_help_option_names(click.Context(cli_group, **cli_group.context_settings)))
    named = []
    for word in words[2:]:
        if word == "--":  # run's own command follows
            break
        if word.startswith("-") and word != "-":
            named.append(word.split("=", 1)[0])
    assert not set(named) - real, f"{_rel(page)}: `{line}`: `clusterwatch {name}` has no {set(named) - real}"
    result = CliRunner().invoke(cli_group, [name, "--help"])
    assert result.exit_code == 0, result.output


def test_the_commands_a_how_to_shows_that_can_run_here_do(tmp_path):
    """`provenance` and one agent poll need no collector, no cluster and no root: run as shown."""
    runnable = sorted({line for _, line in SHOWN
                       if line.split()[1] == "provenance" or line.startswith("clusterwatch agent --once")})
    assert runnable, "no how-to shows a command that can run here"
    for line in runnable:
        # the agent as the tests run it: no kernel log, no GPU (tests/project/test_hermetic.py)
        env = {**clean_environ(), "CLUSTERWATCH_KMSG": "none", "CLUSTERWATCH_GPU_SOURCE": "none"}
        args = [{"DIR": str(ROOT)}.get(word, word) for word in shlex.split(line)[1:]]
        r = subprocess.run([*CLI, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, f"`{line}`: {r.stderr}"
        if "--json" in line:
            json.loads(r.stdout)


# -- config and rules files ------------------------------------------------------------------------------

def _setting_names(section: str) -> set[str]:
    names = set()
    for name in SECTIONS[section]:
        names |= {p.name for p in _options(_commands()[name])}
    return names


TOMLS = [(page, text) for page in PAGES for lang, text in _blocks(page) if lang == "toml"]


@pytest.mark.parametrize(("page", "text"), TOMLS, ids=[f"{_rel(p)}: {t.splitlines()[0][:40]}" for p, t in TOMLS])
def test_a_shown_config_or_rules_file_loads(page, text):
    doc = toml_file.parse(text, f"{_rel(page)}'s example")
    if set(doc) & {"gpus", "profiles", "events"}:  # a simulated GPUs' scenario
        from clusterwatch.agent.backends.sim_scenario import parse_scenario

        parse_scenario(text, f"{_rel(page)}'s example")
    elif set(doc) & (set(SECTIONS) | set(TOP_LEVEL)):  # a config file
        assert not set(doc) - set(SECTIONS) - set(TOP_LEVEL), f"{_rel(page)}: sections {set(doc)}"
        for section in SECTIONS:
            unknown = set(doc.get(section, {})) - _setting_names(section)
            assert not unknown, f"{_rel(page)}: [{section}] has no setting {unknown}"
    else:  # a rules file, or a part of one
        from clusterwatch.collector.rules.config import parse_rules

        parse_rules(text, f"{_rel(page)}'s example")


def test_the_configuration_reference_says_the_keys_that_are_not_the_option_names():
    text = " ".join((DOCS / "configuration.md").read_text().split())
    pairs = re.findall(r"`(--[a-z-]+)` is `([a-z_]+)`", text)
    assert len(pairs) >= 5
    # the settings the config file holds: the agent's, the collector's, and [cli]'s three
    real = {(o, p.name) for name in ("agent", "collector") for p in _options(_commands()[name]) for o in p.opts}
    real |= {(o, p.name) for p in _options(_commands()["status"]) for o in p.opts if p.name != "as_json"}
    assert set(pairs) <= real, f"docs/configuration.md: {sorted(set(pairs) - real)}"
    # and it names every one whose key is not its long option's name
    renamed = {(o, key) for o, key in real if o.startswith("--") and o[2:].replace("-", "_") != key
               and key not in ("as_json", "interval")}
    assert renamed <= set(pairs), sorted(renamed - set(pairs))


# -- python snippets -------------------------------------------------------------------------------------

def test_the_training_how_to_calls_only_what_clusterwatch_train_has():
    from clusterwatch import train

    text = (DOCS / "how-to" / "instrument-training.md").read_text()
    called = {a or b for a, b in re.findall(r"\btrain\.(?:([a-z_]+)\(|([A-Z]\w+))", text)}
    assert called and not {name for name in called if not hasattr(train, name)}
    for module in re.findall(r"clusterwatch\.integrations\.(\w+)", text):
        assert "class ClusterwatchCallback" in (ROOT / "clusterwatch" / "integrations" / f"{module}.py").read_text()


# -- links -----------------------------------------------------------------------------------------------

def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_link_of_a_page_reaches_its_file_and_heading(page):
    broken = []
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", file.read_text(), flags=re.M)
            if anchor not in {_slug(h) for h in headings}:
                broken.append(target)
    assert not broken, f"{_rel(page)}: links that lead nowhere: {broken}"


def test_the_readme_stays_short():
    assert len((ROOT / "README.md").read_text().split()) < 1200
