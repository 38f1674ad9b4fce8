"""clusterwatch/thread_names.py: the agent's threads carry names ps and top show."""
from __future__ import annotations


def test_agent_threads_carry_names_the_system_shows():
    import threading

    from clusterwatch.thread_names import name_os_thread

    seen = []

    def named():
        name_os_thread("cw-sender-and-more")
        with open(f"/proc/self/task/{threading.get_native_id()}/comm") as f:
            seen.append(f.read().strip())

    t = threading.Thread(target=named)
    t.start()
    t.join()
    assert seen == ["cw-sender-and-m"]  # the kernel keeps 15 bytes
