"""Stacks of a job's ranks, grouped: which ranks wait where ("62 ranks in all_reduce at train.py:212").

Pure functions from text to dataclasses. The input is what `py-spy dump --pid PID` prints for each
rank (its text format, or `--json`), or what a cooperating process answers to `dump_stacks`
(clusterwatch/train_requests.py writes the same text). The text format, as py-spy prints it:

    Process 4242: /usr/bin/python3 train.py --lr 3e-4
    Python v3.11.4 (/usr/bin/python3.11)
    [Parent Process 4200: torchrun ...]

    Thread 4242 (active+gil): "MainThread"
        all_reduce (torch/distributed/distributed_c10d.py:2050)
        train_step (train.py:212)
            Arguments:
                batch: <Tensor at 0x7f...>
    Thread 0x7F3A2B1FF640 (idle): "pin_memory"
        wait (threading.py:324)

Frames are innermost first; the thread id is the OS thread id, or the pthread id in hex; the status
is `idle`, `active` or `active+gil`; a native frame (`--native`) has no line; `--locals` adds the
indented Arguments/Locals lines; `--subprocesses` appends more processes after a rule of dashes
(only the first, the rank's own, is read here).

A rank's stack is its main thread's (the thread named MainThread, else the first listed): that is
where a training loop runs and where a hung collective waits. Its place is said the way a person
reads it: the library function the user's code called (the outermost frame past decorators), at
the line of the user's code that called it (`all_reduce at train.py:212`), where "user code" is
the innermost frame outside the standard library and the common frameworks (LIBRARY_PACKAGES):
py-spy shortens paths relative to sys.path, so no site-packages prefix tells them apart.
"""
from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# Top-level packages whose frames are not the user's code (besides the standard library).
LIBRARY_PACKAGES = frozenset({
    "torch", "torchvision", "torchaudio", "transformers", "accelerate", "deepspeed", "lightning",
    "pytorch_lightning", "lightning_fabric", "numpy", "apex", "triton", "datasets", "tokenizers",
    "safetensors", "jax", "jaxlib", "flax", "optax", "tensorflow", "keras", "horovod", "ray", "wandb",
    "mlflow", "tqdm", "peft", "trl", "fairscale", "xformers", "vllm", "clusterwatch", "_pytest", "pytest",
})

# Names of decorator and dispatch frames, which say nothing about what was called.
_WRAPPERS = frozenset({"wrapper", "inner", "wrapped", "_fn", "decorate_context", "_call_impl",
                       "_wrapped_call_impl", "__call__", "wrap"})

_PROCESS = re.compile(r"^Process (\d+): ?(.*)$")
_PYTHON = re.compile(r"^Python v(\S+)")
_THREAD = re.compile(r'^Thread (\S+) \(([^)]*)\)(?:: "(.*)")?\s*$')
_FRAME = re.compile(r"^ {4}(\S.*?) \((.*)\)\s*$")


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame: the function, its file as shown, its line (None for a native frame)."""

    name: str
    file: str
    line: int | None = None

    def __str__(self) -> str:
        return f"{self.name} ({self.file}:{self.line})" if self.line is not None else f"{self.name} ({self.file})"


@dataclass(frozen=True, slots=True)
class Thread:
    """One thread's stack, innermost frame first."""

    ident: str
    status: str
    name: str
    frames: tuple[Frame, ...]


@dataclass(frozen=True, slots=True)
class Dump:
    """One process's stacks. `error` says why there are none (py-spy's own message, or what was wrong)."""

    pid: int | None
    command: str
    python: str
    threads: tuple[Thread, ...]
    error: str = ""


@dataclass(frozen=True, slots=True)
class Group:
    """Ranks whose main threads have the same stack.

    Attributes:
        ranks: the ranks, ascending.
        place: where they are, in words ("all_reduce at train.py:212"); for ranks without stacks,
            "no stacks: <why>".
        frames: the common main-thread stack, innermost first (empty without stacks).
    """

    ranks: tuple[int, ...]
    place: str
    frames: tuple[Frame, ...]

    def summary(self, noun: str = "rank") -> str:
        """`62 ranks in all_reduce at train.py:212`, `rank 17 in ...`, `rank 40: no stacks: ...`.

        `noun`: what the numbers are ("pid" for the processes of a job whose ranks are not known).
        """
        who = rank_list(self.ranks, noun)
        return f"{who}: {self.place}" if not self.frames else f"{who} in {self.place}"


def _frame(text: str) -> Frame | None:
    m = _FRAME.match(text)
    if m is None:
        return None
    name, where = m.group(1), m.group(2)
    file, colon, line = where.rpartition(":")
    if colon and line.isdigit():
        return Frame(name, file, int(line))
    return Frame(name, where)


def parse_dump(text: str) -> Dump:
    """One `py-spy dump` output (text or `--json`), or a `dump_stacks` answer; never raises."""
    stripped = text.lstrip()
    if stripped.startswith("["):
        return _parse_json(stripped)
    pid: int | None = None
    command = python = ""
    threads: list[Thread] = []
    current: tuple[str, str, str] | None = None
    frames: list[Frame] = []

    def close() -> None:
        if current is not None:
            threads.append(Thread(*current, tuple(frames)))

    for raw in text.splitlines():
        line = raw.rstrip("\r")
        if line.startswith("---") and pid is not None:
            break  # --subprocesses: the next process is a child, not this rank
        m = _PROCESS.match(line)
        if m and pid is None:
            pid, command = int(m.group(1)), m.group(2)
            continue
        m = _PYTHON.match(line)
        if m and not python:
            python = m.group(1)
            continue
        m = _THREAD.match(line)
        if m:
            close()
            current, frames = (m.group(1), m.group(2), m.group(3) or ""), []
            continue
        if current is not None and line.startswith("    ") and not line.startswith("        "):
            frame = _frame(line)
            if frame is not None:
                frames.append(frame)
    close()
    if not threads:
        first = next((s.strip() for s in text.splitlines() if s.strip()), "")
        return Dump(pid, command, python, (), error=first[:300] or "empty output")
    return Dump(pid, command, python, tuple(threads))


def _parse_json(text: str) -> Dump:
    try:
        traces = json.loads(text)
    except (ValueError, RecursionError):
        return Dump(None, "", "", (), error="not py-spy's JSON")
    threads = []
    pid = None
    if not isinstance(traces, list):
        return Dump(None, "", "", (), error="not py-spy's JSON")
    for t in traces:
        if not isinstance(t, dict):
            continue
        pid = pid if pid is not None else t.get("pid") if type(t.get("pid")) is int else None
        frames = []
        for f in t.get("frames") or ():
            if isinstance(f, dict):
                line = f.get("line")
                frames.append(Frame(str(f.get("name", "?")), str(f.get("short_filename") or f.get("filename", "?")),
                                    line if type(line) is int and line > 0 else None))
        tid = t.get("os_thread_id") if t.get("os_thread_id") is not None else f"{t.get('thread_id', 0):#X}"
        status = "idle" if not t.get("active", True) else "active+gil" if t.get("owns_gil") else "active"
        threads.append(Thread(str(tid), status, str(t.get("thread_name") or ""), tuple(frames)))
    if not threads:
        return Dump(pid, "", "", (), error="no threads in py-spy's JSON")
    # py-spy prints threads in reverse of its list; keep the order a text dump has
    return Dump(pid, "", "", tuple(reversed(threads)))


def main_thread(dump: Dump) -> Thread | None:
    """The thread named MainThread, else the first one."""
    for t in dump.threads:
        if t.name == "MainThread":
            return t
    return dump.threads[0] if dump.threads else None


def is_library(frame: Frame) -> bool:
    """Whether a frame is the standard library's, a framework's, or native (not the user's code)."""
    path = frame.file.replace("\\", "/")
    if frame.line is None or path.startswith("<"):  # native, <frozen importlib._bootstrap>, <string>
        return True
    if "/site-packages/" in path or "/dist-packages/" in path or re.search(r"/lib/python3[.\d]*/", path):
        return True
    if path.startswith("/"):
        return False  # an absolute path outside the interpreter's trees: the user's
    top = path.split("/", 1)[0].removesuffix(".py")
    return top in LIBRARY_PACKAGES or top in sys.stdlib_module_names


def place(frames: tuple[Frame, ...]) -> str:
    """Where a stack is, in words: the function the innermost user frame called, at that frame's line."""
    if not frames:
        return "no Python frames"
    for i, frame in enumerate(frames):
        if not is_library(frame):
            # the library function the user called: the outermost library frame, past decorators
            called = next((f.name for f in reversed(frames[:i]) if f.name not in _WRAPPERS), frame.name)
            return f"{called} at {frame.file}:{frame.line}"
    inner = frames[0]
    return f"{inner.name} at {inner.file}:{inner.line}" if inner.line is not None else f"{inner.name} in {inner.file}"


def group_ranks(dumps: Mapping[int, str | Dump]) -> list[Group]:
    """Ranks grouped by their main thread's stack, the largest group first (then by lowest rank).

    Args:
        dumps: rank -> its dump (text as py-spy printed it, or a parsed Dump).

    Returns:
        One group per distinct stack, and one per distinct reason among ranks without stacks
        (listed after those with stacks).
    """
    by_stack: dict[tuple[Frame, ...], list[int]] = {}
    by_error: dict[str, list[int]] = {}
    for rank, dump in dumps.items():
        parsed = dump if isinstance(dump, Dump) else parse_dump(dump)
        thread = main_thread(parsed)
        if thread is None:
            by_error.setdefault(parsed.error or "no threads", []).append(rank)
        else:
            by_stack.setdefault(thread.frames, []).append(rank)
    groups = [Group(tuple(sorted(ranks)), place(frames), frames) for frames, ranks in by_stack.items()]
    groups.sort(key=lambda g: (-len(g.ranks), g.ranks[0]))
    errors = [Group(tuple(sorted(ranks)), f"no stacks: {why}", ()) for why, ranks in by_error.items()]
    errors.sort(key=lambda g: g.ranks[0])
    return groups + errors


def rank_list(ranks: Iterable[int], noun: str = "rank") -> str:
    """`rank 17`, `62 ranks` (more than 8), or `ranks 0-3,7` (up to 8, runs collapsed)."""
    ordered = sorted(set(ranks))
    if len(ordered) == 1:
        return f"{noun} {ordered[0]}"
    if len(ordered) > 8:
        return f"{len(ordered)} {noun}s"
    runs: list[str] = []
    start = prev = ordered[0]
    for r in ordered[1:] + [None]:  # type: ignore[list-item]
        if r is not None and r == prev + 1:
            prev = r
            continue
        runs.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return f"{noun}s " + ",".join(runs)


def summarize(dumps: Mapping[int, str | Dump], noun: str = "rank") -> list[str]:
    """One line per group: what `clusterwatch diagnose` prints above the stacks themselves."""
    return [g.summary(noun) for g in group_ranks(dumps)]


def by_rank(answers) -> tuple[dict[int, str], str]:
    """The stacks of answers (query_pb2.TrainAnswerView) by rank, or by pid where a rank is not known; the noun."""
    with_stacks = [a for a in answers if a.payload]
    if with_stacks and all(a.HasField("rank") for a in with_stacks):
        return {a.rank: a.payload for a in with_stacks}, "rank"
    return {a.pid: a.payload for a in with_stacks}, "pid"
