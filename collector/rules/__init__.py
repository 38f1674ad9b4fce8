"""Leak and stall rules: a pure engine over observations, configured by a TOML rules file.

Public surface::

    load_rules(path=None) -> RuleSet         parse_rules(text, source) -> RuleSet
    Engine(rules).observe(ProcessObservation) / observe_gpu(GpuObservation)
                 .observe_gpu_clocks(GpuClockObservation)
                 .heartbeat(NodeHeartbeat) / tick(now) / forget_process(...) / forget_job(...)
                 .forget_node(...) / active() / series()
    evaluate(rules, observations) -> list[AlertEvent]
"""
from .config import (
    ActionsConfig,
    ActionStep,
    AgentDownRule,
    AllowEntry,
    GpuStallRule,
    IdleGpuRule,
    JobSlowdownRule,
    LeakRule,
    LeakWindow,
    Match,
    Override,
    Pattern,
    RuleSet,
    TrainingStallRule,
    load_rules,
    packaged_rules_text,
    parse_rules,
)
from .engine import Engine, evaluate
from .model import (
    FIRING,
    PENDING,
    RESOLVED,
    RULE_NAMES,
    ActiveAlert,
    AlertEvent,
    GpuClockObservation,
    GpuObservation,
    NodeHeartbeat,
    ProcessObservation,
    Rule,
)

__all__ = [
    "ActionStep", "ActionsConfig", "ActiveAlert", "AgentDownRule", "AlertEvent", "AllowEntry", "Engine", "FIRING",
    "GpuClockObservation", "GpuObservation", "GpuStallRule", "IdleGpuRule", "JobSlowdownRule", "LeakRule",
    "LeakWindow", "Match", "NodeHeartbeat", "Override", "PENDING", "Pattern", "ProcessObservation", "RESOLVED",
    "RULE_NAMES", "Rule", "RuleSet", "TrainingStallRule", "evaluate", "load_rules", "packaged_rules_text",
    "parse_rules",
]
