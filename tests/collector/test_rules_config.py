"""Rules-file loading: defaults, units, errors that name file and line."""
import pytest
from clusterwatch.collector.rules import load_rules, parse_rules
from clusterwatch.collector.rules.config import MB

from clusterwatch.errors import ConfigError


def test_shipped_defaults_load():
    r = load_rules()
    assert r.gpu_memory_leak.min_rate_per_h == 50 * MB
    assert r.gpu_stall.for_s == 360
    assert r.actions.allow_signals is False


def test_units_and_windows():
    r = parse_rules("[host_memory_leak]\nmin_rate_mb_per_h = 80\nwindows = [[600, 900]]\n")
    assert r.host_memory_leak.min_rate_per_h == 80 * MB
    assert r.host_memory_leak.windows[0].window_s == 600 and r.host_memory_leak.windows[0].min_rate_per_h == 900 * MB


def test_code_mismatch_accepted():
    assert parse_rules('[code_mismatch]\nseverity = "critical"\n').code_mismatch.severity == "critical"


@pytest.mark.parametrize("text, needle", [
    ("[gpu_stall]\nfor_s = 10\nfoo = 1\n", "line 3"),
    ("[gpu_stall]\nfor_s = \"x\"\n", "line 2"),
    ("[gpu_stall\n", "line 1"),
    ("[nope]\n", "unknown table"),
    ('[[allow]]\nuser = "re:("\nrules = ["gpu_stall"]\n', "bad regular expression"),
    ('[[allow]]\nuser = "x"\nrules = ["no_such_rule"]\n', "unknown rule"),
    ('[actions]\n[[actions.steps]]\naction = "webhook"\n', "webhook needs url"),
    ('[gpu_memory_leak]\nseverity = "loud"\n', "severity must be one of"),
])
def test_errors_name_file_and_line(text, needle):
    with pytest.raises(ConfigError) as exc:
        parse_rules(text, "my.toml")
    msg = str(exc.value)
    assert msg.startswith("my.toml") and needle in msg and "\n" not in msg


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_rules(tmp_path / "none.toml")


def test_leak_noise_guards_and_windows_defaults():
    r = load_rules().gpu_memory_leak
    assert r.min_t_stat == 4.0 and r.min_mk_z == 3.5
    assert [w.window_s for w in r.windows] == [900, 1200, 1800, 2700, 4500, 7200, 10800, 14400, 21600, 28800]
    assert r.min_growth == 32 * MB and r.bend_ratio == 0.8
    assert parse_rules("[host_memory_leak]\nmin_mk_z = 2.5\n").host_memory_leak.min_mk_z == 2.5
