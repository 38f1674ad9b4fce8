"""Rules-file schema: generated files load into the objects they describe; a wrong key or value
anywhere is named with its file, line and table; the shipped rules load as they always have."""
import dataclasses
import json
import re

import pytest
from clusterwatch.collector.rules import (
    RULE_NAMES,
    ActionsConfig,
    ActionStep,
    AllowEntry,
    LeakWindow,
    Match,
    Override,
    Pattern,
    RuleSet,
    load_rules,
    packaged_rules_text,
    parse_rules,
)
from clusterwatch.collector.rules.config import MB, SEVERITIES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterwatch.errors import ConfigError
from tests.support.helpers import ROOT, TESTS

GOLDEN = TESTS / "golden" / "rules"
DEFAULTS = RuleSet()

# ---- what a file may say, each with the value it must load as (the oracle, by construction) ----

numbers = st.one_of(st.integers(0, 10**7), st.floats(0, 1e7, allow_nan=False, allow_infinity=False))


def number(scale=1.0):
    return numbers.map(lambda x: (x, float(x) * scale))


bools = st.booleans().map(lambda b: (b, b))
severities = st.sampled_from(SEVERITIES).map(lambda s: (s, s))


def windows(scale):
    pair = st.tuples(st.integers(1, 10**6) | st.floats(0.5, 1e6), numbers)
    return st.lists(pair, min_size=1, max_size=4).map(lambda ws: (
        [list(w) for w in ws],
        tuple(sorted((LeakWindow(float(a), float(b) * scale) for a, b in ws), key=lambda w: w.window_s))))


def leak_keys(memory):
    scale = MB if memory else 1.0
    keys = {"enabled": ("enabled", bools), "severity": ("severity", severities),
            "warmup_s": ("warmup_s", number()), "bucket_s": ("bucket_s", number()),
            "sub_buckets": ("sub_buckets", st.integers(0, 40).map(lambda n: (n, max(6, n)))),
            "windows": ("windows", windows(scale))}
    for name in ("min_t_stat", "min_mk_z", "rise_fraction", "max_jump_fraction",
                 "urgent_time_to_full_s", "resolve_fraction"):
        keys[name] = (name, number())
    if memory:
        keys["min_rate_mb_per_h"] = ("min_rate_per_h", number(MB))
        keys["min_growth_mb"] = ("min_growth", number(MB))
    else:
        keys["min_rate_per_h"] = ("min_rate_per_h", number())
        keys["min_growth"] = ("min_growth", number())
    return keys


def simple_keys(**extra):
    return {"enabled": ("enabled", bools), "severity": ("severity", severities),
            **{k: (k, v) for k, v in extra.items()}}


FILE_KEYS = {
    "gpu_memory_leak": leak_keys(True), "host_memory_leak": leak_keys(True), "handle_leak": leak_keys(False),
    "gpu_stall": simple_keys(util_below_percent=number(), for_s=number(), pending_after_s=number(),
                             require_busy_first=bools, busy_percent=number()),
    "training_stall": simple_keys(for_s=number(), pending_after_s=number()),
    "idle_gpu": simple_keys(util_below_percent=number(), for_s=number()),
    "agent_down": simple_keys(after_s=number()),
    "code_mismatch": simple_keys(),
}


@st.composite
def rule_table(draw, rule):
    """(file table, field → loaded value), keys in file order."""
    names = draw(st.lists(st.sampled_from(sorted(FILE_KEYS[rule])), unique=True, max_size=6))
    table, fields = {}, {}
    for name in names:
        field, values = FILE_KEYS[rule][name]
        table[name], fields[field] = draw(values)
    return table, fields


words = st.text("abc*?-_.0123", min_size=1, max_size=8)
patterns = st.one_of(words.map(lambda w: (w, Pattern(w))),
                     st.sampled_from(["a+", "^x[0-9]*$", "(re|ex)", "b.c"]).map(
                         lambda r: ("re:" + r, Pattern("re:" + r, re.compile(r)))))
MATCH_KEYS = ("job_name", "user", "partition", "command")


@st.composite
def match(draw):
    keys = draw(st.lists(st.sampled_from(MATCH_KEYS), unique=True, min_size=1, max_size=4))
    pairs = {k: draw(patterns) for k in keys}
    return {k: p[0] for k, p in pairs.items()}, Match(**{k: p[1] for k, p in pairs.items()})


@st.composite
def override(draw):
    table, m = draw(match())
    changes = []
    for rule in draw(st.lists(st.sampled_from(sorted(FILE_KEYS)), unique=True, max_size=3)):
        sub, fields = draw(rule_table(rule))
        table[rule] = sub
        changes.append((rule, tuple(fields.items())))
    return table, Override(m, tuple(changes))


@st.composite
def allow(draw):
    table, m = draw(match())
    table["rules"] = draw(st.lists(st.sampled_from(RULE_NAMES), max_size=4))
    reason = draw(st.none() | st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=20))
    if reason is not None:
        table["reason"] = reason
    return table, AllowEntry(m, tuple(table["rules"]), reason or "")


@st.composite
def step(draw):
    kind = draw(st.sampled_from(["log", "webhook", "command", "signal"]))
    table = {"action": kind}
    if kind == "webhook":
        table["url"] = draw(st.sampled_from(["http://", "https://"])) + draw(words)
    if kind == "command":
        table["command"] = draw(st.lists(words, min_size=1, max_size=3))
    if kind == "signal":
        table["signal"] = draw(st.sampled_from(["SIGUSR1", "SIGUSR2", "SIGTERM", "SIGINT"]))
    kw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in table.items()}
    for key, values in (("after_s", number()), ("timeout_s", number()), ("on_resolved", bools),
                        ("min_severity", severities)):
        if draw(st.booleans()):
            table[key], kw[key] = draw(values)
    if draw(st.booleans()):
        table["rules"] = draw(st.lists(st.sampled_from(RULE_NAMES), max_size=3))
        kw["rules"] = tuple(table["rules"])
    return table, ActionStep(**kw)


@st.composite
def rules_file(draw):
    """(the file as a dict, the RuleSet it must load as)."""
    doc, kw = {}, {}
    for rule in draw(st.lists(st.sampled_from(sorted(FILE_KEYS)), unique=True)):
        doc[rule], fields = draw(rule_table(rule))
        kw[rule] = dataclasses.replace(getattr(DEFAULTS, rule), **fields)
    for name, entries in (("overrides", override()), ("allow", allow())):
        if draw(st.booleans()):
            pairs = draw(st.lists(entries, max_size=3))
            doc[name], kw[name] = [p[0] for p in pairs], tuple(p[1] for p in pairs)
    if draw(st.booleans()):
        doc["actions"], actions = {}, {}
        if draw(st.booleans()):
            doc["actions"]["allow_signals"] = actions["allow_signals"] = draw(st.booleans())
        if draw(st.booleans()):
            pairs = draw(st.lists(step(), max_size=4))
            doc["actions"]["steps"], actions["steps"] = [p[0] for p in pairs], tuple(p[1] for p in pairs)
        kw["actions"] = dataclasses.replace(ActionsConfig(), **actions)
    return doc, dataclasses.replace(DEFAULTS, **kw)


# ---- writing a dict as TOML, the way people write rules files -------------------------------

def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, (int, str)):
        return json.dumps(v, ensure_ascii=False)
    return "[" + ", ".join(toml_value(x) for x in v) + "]"


def toml_text(doc, prefix=""):
    """Scalars first, then [sub] tables and [[array]] entries, each under its own header."""
    lines = [f"{k} = {toml_value(v)}" for k, v in doc.items()
             if not isinstance(v, dict) and not (isinstance(v, list) and v and isinstance(v[0], dict))]
    for k, v in doc.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            lines += ["", f"[{name}]", toml_text(v, name + ".")]
        elif isinstance(v, list) and v and isinstance(v[0], dict):
            for entry in v:
                lines += ["", f"[[{name}]]", toml_text(entry, name + ".")]
    return "\n".join(lines)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rules_file())
def test_generated_files_load_as_written(case):
    doc, expected = case
    assert parse_rules(toml_text(doc) + "\n", "gen.toml") == expected


def tables_of(doc, path=()):
    """Every table of a file, with the path an error names it by ("overrides #2.gpu_stall")."""
    for k, v in doc.items():
        if isinstance(v, dict):
            yield (*path, k), v
            yield from tables_of(v, (*path, k))
        elif isinstance(v, list) and v and isinstance(v[0], dict):
            for i, entry in enumerate(v, 1):
                yield (*path, k, i), entry
                yield from tables_of(entry, (*path, k, i))


def where(path):
    out = ""
    for p in path:
        out += f" #{p}" if isinstance(p, int) else (f".{p}" if out else p)
    return out


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rules_file(), st.data())
def test_a_wrong_key_or_value_is_named_with_its_line(case, data):
    doc, _ = case
    tables = [t for t in tables_of(doc)]
    if not tables:
        doc["gpu_stall"] = {}
        tables = [(("gpu_stall",), doc["gpu_stall"])]
    path, table = data.draw(st.sampled_from(tables))
    numeric = [k for k, v in table.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if numeric and data.draw(st.booleans()):
        key = data.draw(st.sampled_from(numeric))
        table[key] = "zz-not-a-number"
        needle = f"{key} must be a number, not 'zz-not-a-number'"
    else:
        key = "zz_wrong_key"
        table[key] = 1
        needle = "unknown key 'zz_wrong_key' (known: "
    text = toml_text(doc) + "\n"
    line = next(i for i, t in enumerate(text.splitlines(), 1) if "zz" in t)
    with pytest.raises(ConfigError) as exc:
        parse_rules(text, "gen.toml")
    assert str(exc.value).startswith(f"gen.toml: line {line}: [{where(path)}] {needle}"), (text, exc.value)


# ---- golden: the shipped rules files and the documented examples load as they always have ----

def plain(obj):
    """Dataclasses as dicts with their class name, regular expressions as pattern and flags."""
    if dataclasses.is_dataclass(obj):
        return {"__type__": type(obj).__name__, **{f.name: plain(getattr(obj, f.name))
                                                   for f in dataclasses.fields(obj)}}
    if isinstance(obj, (tuple, list)):
        return [plain(x) for x in obj]
    if isinstance(obj, re.Pattern):
        return {"regex": obj.pattern, "flags": obj.flags}
    return obj


def doc_examples():
    return re.findall(r"```toml\n(.*?)```", (ROOT / "docs" / "rules.md").read_text(), re.S)


@pytest.mark.parametrize("name, text", [
    ("default_rules", packaged_rules_text("default_rules.toml")),
    ("demo_rules", packaged_rules_text("demo_rules.toml")),
    *((f"docs_rules_{i}", t) for i, t in enumerate(doc_examples(), 1)),
])
def test_shipped_rules_load_as_the_golden_objects(name, text):
    # The golden files were written by the hand-written validator this schema replaced
    # (commit 5a1a203); json keeps 1 apart from 1.0, so a unit slip shows.
    expected = (GOLDEN / f"{name}.json").read_text()
    assert json.dumps(plain(parse_rules(text, name)), indent=1) + "\n" == expected


def test_docs_show_two_examples_and_defaults_match_the_dataclasses():
    assert len(doc_examples()) == 2
    shipped = load_rules()
    # the default file restates the dataclass defaults; a drift between them would be a silent change
    assert shipped.gpu_memory_leak == DEFAULTS.gpu_memory_leak and shipped.gpu_stall == DEFAULTS.gpu_stall


@pytest.mark.parametrize("text", [
    "[gpu_stall]\nfor = 360\n",
    '[[actions.steps]]\naction = "log"\n[[actions.steps]]\naction = "webhook"\nurl = "hooks.example"\n',
])
def test_the_errors_docs_rules_shows_are_the_ones_users_get(text):
    with pytest.raises(ConfigError) as exc:
        parse_rules(text, "rules.toml")
    assert str(exc.value) in (ROOT / "docs" / "rules.md").read_text().splitlines()
