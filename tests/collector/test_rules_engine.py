"""Engine behaviour on hand-made observations: lifecycle, figures, overrides, allow-list, GPUs, nodes."""
import json

from clusterwatch.collector.rules import (
    Engine,
    GpuObservation,
    NodeHeartbeat,
    ProcessObservation,
    evaluate,
    load_rules,
    parse_rules,
)

MB = 1024 * 1024
GB = 1024 * MB


def _leaking(rate_mb_h=2000.0, hours=3.0, total=80 * GB, command="python train.py", user="alice", rank=3):
    t = 0.0
    while t < hours * 3600:
        yield ProcessObservation(t=t, node="gpu022", job_id="9001", pid=4242, gpu="GPU-1", rank=rank,
                                 user=user, command=command, gpu_mem_bytes=30 * GB + rate_mb_h * MB * t / 3600,
                                 gpu_mem_total_bytes=total, gpu_util=95.0, rss_bytes=6 * GB, step=int(t))
        t += 15.0


def test_fast_leak_fires_with_figures_and_one_line_description():
    evs = evaluate(load_rules(), _leaking())
    firing = [e for e in evs if e.state == "firing"]
    assert [e.rule for e in firing] == ["gpu_memory_leak"]
    e = firing[0]
    assert 1800 <= e.t <= 3600  # after the 30 min warm-up, within a short window
    d = e.to_dict()
    assert abs(d["rate_bytes_per_h"] / MB - 2000) < 100
    assert d["time_to_full_s"] > 0 and d["growth_for_s"] >= 900
    assert "rank 3 (pid 4242 on gpu022" in e.description and "GiB/h" in e.description and "full in" in e.description
    json.dumps(d)


def test_override_raises_threshold_for_matching_job():
    rules = parse_rules('[[overrides]]\ncommand = "*train.py"\n[overrides.gpu_memory_leak]\n'
                        'min_rate_mb_per_h = 5000\nwindows = [[900, 5000], [3600, 5000]]\n')
    assert not [e for e in evaluate(rules, _leaking()) if e.state == "firing"]
    assert [e for e in evaluate(rules, _leaking(command="other")) if e.state == "firing"]


def test_allow_list_silences_rule_by_regex():
    rules = parse_rules('[[allow]]\nuser = "re:^ali"\nrules = ["gpu_memory_leak"]\nreason = "known"\n')
    assert not [e for e in evaluate(rules, _leaking()) if e.rule == "gpu_memory_leak"]
    assert [e for e in evaluate(rules, _leaking(user="bob")) if e.rule == "gpu_memory_leak"]


def test_stall_pending_firing_resolved_and_forget():
    eng = Engine(load_rules())
    states = []
    for i in range(200):
        t = i * 10.0
        util = 0.0 if 600 <= t < 1200 else 90.0
        for e in eng.observe(ProcessObservation(t=t, node="n1", job_id="1", pid=7, gpu_util=util)):
            states.append((e.rule, e.state, e.t))
    assert [s[:2] for s in states] == [("gpu_stall", "pending"), ("gpu_stall", "firing"), ("gpu_stall", "resolved")]
    assert states[1][2] - 600 >= 360
    # a stall still on when the process goes away resolves
    for i in range(60):
        eng.observe(ProcessObservation(t=3000 + i * 10.0, node="n1", job_id="1", pid=7, gpu_util=0.0))
    [active] = eng.active()
    assert (active.rule, active.state, active.node, active.pid, active.start_time) == ("gpu_stall", "firing", "n1", 7,
                                                                                     0.0)
    gone = eng.forget_process("n1", 7, 0.0, 4000.0)
    assert [(e.rule, e.state) for e in gone] == [("gpu_stall", "resolved")]
    assert not eng.active()


def test_checkpoint_pause_is_not_a_stall():
    eng = Engine(load_rules())
    evs = []
    for i in range(400):
        t = i * 15.0
        util = 0.0 if (t % 1800) < 150 else 95.0
        evs += eng.observe(ProcessObservation(t=t, node="n", pid=1, gpu_util=util, step=i))
    assert not [e for e in evs if e.state == "firing"]


def test_training_stall_at_full_utilisation():
    eng = Engine(load_rules())
    evs = []
    for i in range(100):
        t = i * 20.0
        evs += eng.observe(ProcessObservation(t=t, node="n", pid=1, gpu_util=100.0, step=min(i, 50)))
    fired = [e for e in evs if e.state == "firing"]
    assert fired and fired[0].rule == "training_stall" and 1000 + 360 <= fired[0].t <= 1000 + 420
    assert "hung collective" in fired[0].description


def test_pid_reuse_is_a_new_process():
    eng = Engine(load_rules())
    for i in range(30):
        eng.observe(ProcessObservation(t=i * 10.0, node="n", pid=5, start_time=1.0, gpu_util=90.0, step=i))
    # same pid, new start time: its frozen step starts a fresh history, no stall
    evs = []
    for i in range(30):
        evs += eng.observe(ProcessObservation(t=300 + i * 30.0, node="n", pid=5, start_time=2.0, gpu_util=90.0, step=0))
    assert not evs


def test_idle_gpu_and_agent_down():
    eng = Engine(load_rules())
    evs = []
    for i in range(40):
        evs += eng.observe_gpu(GpuObservation(t=i * 60.0, node="g1", gpu="GPU-x", job_id="42", utilization=0.0,
                                              processes=0, index=2))
    assert [e.state for e in evs] == ["pending", "firing"]
    assert evs[1].gpu == "GPU-x" and "job 42" in evs[1].description
    assert [e.state for e in eng.forget_job("42", 2500.0)] == ["resolved"]
    assert eng.heartbeat(NodeHeartbeat(t=0.0, node="g2")) == []
    assert eng.tick(30.0) == []
    down = eng.tick(61.0)
    assert [(e.rule, e.state, e.node) for e in down] == [("agent_down", "firing", "g2")]
    assert eng.tick(90.0) == []
    assert [e.state for e in eng.heartbeat(NodeHeartbeat(t=100.0, node="g2"))] == ["resolved"]


def test_a_node_that_sends_rarely_is_down_after_three_of_its_sends():
    eng = Engine(load_rules())  # agent_down after 60 s
    eng.heartbeat(NodeHeartbeat(t=0.0, node="slow", every_s=30.0))
    assert eng.tick(75.0) == []  # two and a half send intervals: not yet
    assert [e.rule for e in eng.tick(91.0)] == ["agent_down"]


def test_node_without_jobs_is_not_down():
    eng = Engine(load_rules())
    eng.heartbeat(NodeHeartbeat(t=0.0, node="idle", has_jobs=False))
    assert eng.tick(10_000.0) == []


def test_leak_that_stops_resolves():
    # 1 GB/h from 1 h to 3 h, then flat: fires during the growth, resolves once the windows
    # that fired (and the longer ones) see it flat, and does not fire again.
    evs = []
    eng = Engine(load_rules())
    for i in range(int(9 * 3600 / 20)):
        t = i * 20.0
        grown = min(max(t - 3600, 0.0), 7200.0) / 3600 * 1024 * MB
        evs += eng.observe(ProcessObservation(t=t, node="n", pid=3, gpu_mem_bytes=30 * GB + grown + (i % 7) * MB))
    assert [e.state for e in evs] == ["firing", "resolved"]
    assert 3600 < evs[0].t < 3 * 3600 < evs[1].t
    assert "stopped growing" in evs[1].description
