"""The XID catalog (data, with sources; site overrides) and the pure decisions of the health rules."""
from __future__ import annotations

from pathlib import Path

import pytest
from clusterwatch.collector.health.decisions import (
    GpuUser,
    MemoryCounters,
    MemoryErrorThresholds,
    ThrottleRule,
    gpu_lost,
    gpu_memory_errors,
    gpu_throttle,
    gpu_xid,
    throttle_share,
    worst_first,
)
from clusterwatch.collector.health.xid_catalog import ACTIONS, SEVERITIES, CatalogError, load_catalog

CATALOG = load_catalog()


# --- the catalog ------------------------------------------------------------------------------

def test_every_shipped_entry_names_known_sources_and_allowed_values() -> None:
    assert len(CATALOG.entries) >= 20
    for xid, entry in CATALOG.entries.items():
        assert entry.xid == xid and entry.known
        assert entry.sources and all(s in CATALOG.sources for s in entry.sources), xid
        assert entry.severity in SEVERITIES and entry.action in ACTIONS, xid
        assert entry.advice.endswith(".") and entry.name, xid
    for key, text in CATALOG.sources.items():
        assert "http" in text or "/" in text, key    # where to read it


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68])
def test_the_device_plugins_application_xids_are_application_errors(xid: int) -> None:
    entry = CATALOG.lookup(xid)
    assert entry.application and entry.severity in ("info", "warning")
    assert "k8s_device_plugin" in entry.sources


@pytest.mark.parametrize("xid, action", [(48, "drain"), (63, "reset_gpu"), (64, "drain"), (74, "drain"),
                                         (79, "drain"), (92, "none"), (94, "restart_app"), (95, "drain"),
                                         (119, "reset_gpu"), (120, "reset_gpu")])
def test_hardware_xids_carry_the_catalogs_action(xid: int, action: str) -> None:
    entry = CATALOG.lookup(xid)
    assert not entry.application and entry.action == action
    assert entry.severity == ("warning" if xid in (63, 92) else "critical")


def test_an_xid_in_no_catalog_says_to_look_it_up() -> None:
    entry = CATALOG.lookup(4242)
    assert not entry.known and entry.severity == "warning" and "not in clusterwatch's catalog" in entry.advice


def test_a_site_overrides_field_by_field_and_adds_entries(tmp_path: Path) -> None:
    site = tmp_path / "site.toml"
    site.write_text('[xid.13]\nseverity = "critical"\nadvice = "Our kernels never fault: page the on-call."\n'
                    '[xid.999]\nname = "Made up"\nseverity = "info"\naction = "none"\nadvice = "Ignore it."\n')
    catalog = load_catalog(site)
    e13 = catalog.lookup(13)
    assert (e13.severity, e13.advice, e13.name, e13.application) == (
        "critical", "Our kernels never fault: page the on-call.", "Graphics Engine Exception", True)
    assert e13.sources == ("site",)
    assert catalog.lookup(999).sources == ("site",) and catalog.lookup(999).known
    assert catalog.lookup(79) == CATALOG.lookup(79)


@pytest.mark.parametrize("text, says", [
    ('[xid.13]\nseverity = "fatal"\n', "line 2: [xid.13] severity must be one of info, warning, critical, not 'fatal'"),
    ('[xid.13]\naction = "pray"\n', "action must be one of none, restart_app"),
    ('[xid.13]\napplication = "yes"\n', "line 2: [xid.13] application must be true or false, not 'yes'"),
    ('[xid.13]\nsources = "nvidia"\n', "sources must be a list of [sources] keys"),
    ('[sources]\nblog = 3\n', "line 2: [sources] blog must be a string"),
    ('[xid.13]\ncolour = "red"\n', "unknown field 'colour'"),
    ('[xid.thirteen]\nseverity = "info"\n', "must be an XID number"),
    ('[xid.500]\nseverity = "info"\n', "a new entry needs name, action, advice"),
    ('[xid.13]\nsources = ["blog"]\n', "source 'blog' is not in [sources]"),
    ('[xids.13]\n', "unknown table [xids]"),
    ('[xid.13\n', "line 1: not valid TOML"),
])
def test_a_wrong_site_file_is_one_line_naming_file_and_table(tmp_path: Path, text: str, says: str) -> None:
    site = tmp_path / "site.toml"
    site.write_text(text)
    with pytest.raises(CatalogError) as err:
        load_catalog(site)
    message = str(err.value)
    assert says in message and str(site) in message and "\n" not in message


def test_a_missing_site_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="cannot read it"):
        load_catalog(tmp_path / "nope.toml")


# --- gpu_xid, gpu_lost ------------------------------------------------------------------------

RANKS = [GpuUser("1234", rank=3, pid=77, process="python"), GpuUser("1234", rank=4, pid=78, process="python")]


def test_an_application_xid_is_a_warning_naming_the_process_and_its_rank() -> None:
    f = gpu_xid(CATALOG, node="n1", uuid="GPU-a", xid=13, pid=77, process="python", users=RANKS)
    assert (f.rule, f.severity, f.action) == ("gpu_xid", "warning", "restart_app")
    assert f.description == ("XID 13 (Graphics Engine Exception) on GPU GPU-a of n1: "
                             "process python (pid 77) of job 1234 rank 3")
    assert f.labels == {"xid": "13", "action": "restart_app", "pid": "77", "job_id": "1234", "rank": "3"}


def test_an_application_xid_of_a_pid_no_job_holds_names_the_process_only() -> None:
    f = gpu_xid(CATALOG, node="n1", uuid="GPU-a", xid=31, pid=5, process="cuda-test", users=RANKS)
    assert f.description.endswith(": process cuda-test (pid 5)") and "job_id" not in f.labels


def test_a_hardware_xid_is_critical_and_names_every_rank_on_the_gpu() -> None:
    f = gpu_xid(CATALOG, node="n1", uuid="GPU-a", xid=48, users=RANKS)
    assert (f.severity, f.action) == ("critical", "drain")
    assert f.description.endswith(": job 1234 rank 3, job 1234 rank 4")
    assert f.labels["rank"] == "3,4" and "Drain the node" in f.advice


def test_gpu_lost_from_xid_79_or_nvml_names_the_job_and_ranks() -> None:
    f = gpu_lost(node="n1", uuid="GPU-a", xid=79, users=RANKS[:1])
    assert f.rule == "gpu_lost" and f.severity == "critical"
    assert f.description == "GPU GPU-a of n1 fell off the bus (XID 79); it held job 1234 rank 3"
    assert f.labels == {"cause": "xid", "job_id": "1234", "rank": "3"}
    assert gpu_lost(node="n1", uuid="GPU-a", nvml_lost=True).labels == {"cause": "nvml"}
    assert gpu_lost(node="n1", uuid="GPU-a", xid=13) is None
    assert gpu_lost(node="n1", uuid="GPU-a") is None


# --- gpu_memory_errors ------------------------------------------------------------------------

@pytest.mark.parametrize("counters, severity, says", [
    (MemoryCounters(ecc_uncorrected_volatile=1), "critical", "1 uncorrected ECC errors"),
    (MemoryCounters(remapped_rows_failure=True), "critical", "could not be remapped"),
    (MemoryCounters(remapped_rows_pending=True), "warning", "waits for a GPU reset"),
    (MemoryCounters(retired_pages_sbe=40, retired_pages_dbe=20), "critical", "60 retired pages"),
    (MemoryCounters(ecc_uncorrected_volatile=0, remapped_rows_pending=False, retired_pages_sbe=59), None, None),
    (MemoryCounters(), None, None),     # a GPU that reports none of them
])
def test_memory_errors_over_thresholds(counters: MemoryCounters, severity: str | None, says: str | None) -> None:
    f = gpu_memory_errors(counters, node="n1", uuid="GPU-a", users=RANKS[:1])
    if severity is None:
        assert f is None
        return
    assert f.severity == severity and says in f.description and f.labels["rank"] == "3"


def test_memory_error_thresholds_are_settable() -> None:
    t = MemoryErrorThresholds(uncorrected_volatile=5, remap_pending=False)
    assert gpu_memory_errors(MemoryCounters(ecc_uncorrected_volatile=4, remapped_rows_pending=True),
                             node="n", uuid="g", thresholds=t) is None


# --- gpu_throttle -----------------------------------------------------------------------------

def test_throttle_share_holds_each_reading_until_the_next() -> None:
    # thermal (0x40) from 100 to 160, power cap (0x4, not a health reason) after
    samples = [(100.0, 0x40), (130.0, 0x40), (160.0, 0x4)]
    share, covered, seen = throttle_share(samples, 100.0, 200.0)
    assert (round(share, 6), covered, seen) == (0.6, 100.0, 0x40)
    assert throttle_share([], 0.0, 10.0) == (0.0, 0.0, 0)


def test_gpu_throttle_fires_on_a_running_jobs_gpu_throttled_long_enough() -> None:
    rule = ThrottleRule(window_s=300.0, min_share=0.5)
    samples = [(float(t), 0x80 if t >= 100 else 0) for t in range(0, 400, 30)]
    f = gpu_throttle(rule, samples, 390.0, node="n1", uuid="GPU-a", users=RANKS[:1])
    assert f is not None and f.rule == "gpu_throttle"
    assert "hardware power brake" in f.description and "job 1234 rank 3" in f.description
    assert f.labels["share"] == "0.90"    # 90..120 s unthrottled: the reading at 90 holds until 120
    assert gpu_throttle(rule, samples, 390.0, node="n1", uuid="GPU-a", users=()) is None   # no job on it
    assert gpu_throttle(rule, samples[-3:], 390.0, node="n1", uuid="GPU-a", users=RANKS) is None   # watched 60 s
    calm = [(t, 0x4) for t, _ in samples]
    assert gpu_throttle(rule, calm, 390.0, node="n1", uuid="GPU-a", users=RANKS) is None


def test_findings_worst_first() -> None:
    a = gpu_xid(CATALOG, node="n1", uuid="GPU-a", xid=13, pid=77, users=RANKS)
    b = gpu_lost(node="n1", uuid="GPU-b", xid=79)
    assert [f.rule for f in worst_first([a, b])] == ["gpu_lost", "gpu_xid"]
