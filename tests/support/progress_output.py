"""Output as tqdm, the Hugging Face Trainer and Lightning write it to a file (tqdm is not in the venv: its
format_meter's layout, written the way it writes a bar to a file: "\\r" before each update, "\\n" when it closes)."""
from __future__ import annotations


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m:02d}:{s:02d}"


def tqdm_bar(n: int, total: int, desc: str = "", rate: float = 44.1, postfix: str = "", ascii_bar: bool = False,
             width: int = 10) -> str:
    """One bar as tqdm.format_meter lays it out: "{desc}: {pct:3.0f}%|{bar}| {n}/{total} [{el}<{rem}, {rate}it/s]"."""
    frac = n / total
    if ascii_bar:
        filled = int(frac * width)
        bar = ("#" * filled).ljust(width)
    else:
        eighths = int(frac * width * 8)
        bar = "█" * (eighths // 8) + (" ▏▎▍▌▋▊▉"[eighths % 8] if eighths % 8 else "")
        bar = bar.ljust(width)
    head = f"{desc}: " if desc else ""
    tail = f", {postfix}" if postfix else ""
    return (f"{head}{frac * 100:3.0f}%|{bar}| {n}/{total} [{_clock(n / rate)}<{_clock((total - n) / rate)}, "
            f"{rate:.1f}it/s{tail}]")


def tqdm_run(total: int, every: int = 1, desc: str = "", postfix=None, close: bool = True) -> str:
    """A whole bar's life in a file: "\\r"-separated updates, a newline when it closes."""
    out = []
    for n in range(0, total + 1, every):
        out.append("\r" + tqdm_bar(n, total, desc, postfix=postfix(n) if postfix else ""))
    return "".join(out) + ("\n" if close else "")


def hf_trainer(max_steps: int = 60, log_every: int = 20, eval_steps: int = 30, eval_batches: int = 8) -> str:
    """The Trainer's stderr and stdout in one file: its bar over max_steps, a log dict every log_every steps, an
    evaluation bar (shorter, leave=False) every eval_steps."""
    out = []
    for step in range(0, max_steps + 1):
        out.append("\r" + tqdm_bar(step, max_steps))
        if step and step % log_every == 0:
            lr = 5e-05 * (1 - step / max_steps)
            out.append(f"\n{{'loss': {1.0 / step:.4f}, 'grad_norm': 1.23, 'learning_rate': {lr:.1e}, "
                       f"'epoch': {step / max_steps:.2f}}}\n")
        if step and step % eval_steps == 0:
            for b in range(eval_batches + 1):
                out.append("\r" + tqdm_bar(b, eval_batches))
            out.append(f"\n{{'eval_loss': 0.5, 'eval_runtime': 1.2, 'epoch': {step / max_steps:.2f}}}\n")
    return "".join(out)


def lightning(epochs: int = 3, batches: int = 20, val_batches: int = 5) -> str:
    """Lightning's TQDMProgressBar: "Epoch N" over the epoch's batches with v_num and loss, and a validation bar."""
    out = []
    for epoch in range(epochs):
        for b in range(batches + 1):
            loss = 1.0 / (1 + epoch * batches + b)
            out.append("\r" + tqdm_bar(b, batches, f"Epoch {epoch}", postfix=f"v_num=0, train_loss={loss:.3f}"))
        for b in range(val_batches + 1):
            out.append("\r" + tqdm_bar(b, val_batches, "Validation DataLoader 0"))
        out.append("\n")
    return "".join(out)
