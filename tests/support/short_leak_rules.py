"""A leak rule with a 20 s window, for the end-to-end tests of a leak: the demo rules' 35 s window and their
5 s points made each of them wait out the better part of a minute for what a shorter window proves as well.
Never on a cluster: a 20 s window fires on any allocator warming up.

The live rules look at a process once a batch, at its latest sample: an agent under these rules sends a batch
each poll (`--send-interval 0`), or at its default 5 s most 2 s points stay empty and nothing fires (replay,
which reads every sample kept, would still fire)."""
from __future__ import annotations

WINDOW_S = 20
#: The window's points, 2 s apart: ten of them, so that a steady growth clears the rank test with room to spare
#: (its score tops out at 3.9 on ten points, 2.6 on the six the demo rules' sub_buckets would cut).
BUCKET_S = 2


def short_leak_rules(rule: str = "host_memory_leak", min_growth_mb: int = 40) -> str:
    """The rules file's section for `rule` (host_memory_leak or gpu_memory_leak), a 20 s window."""
    return (f"[{rule}]\nmin_rate_mb_per_h = 50\nmin_growth_mb = {min_growth_mb}\nwarmup_s = 0\n"
            f"bucket_s = {BUCKET_S}\nwindows = [[{WINDOW_S}, 50]]\nsub_buckets = {WINDOW_S // BUCKET_S}\n"
            "min_t_stat = 3.0\nmin_mk_z = 2.5\n")
