"""Where the time of own_pipeline_overhead.py's windows goes: on the CPU, waiting for one, blocked,
and page faults.

The same objects and loops as benchmarks/own_pipeline_overhead.py (bare, feedbench.measure), plus
feedbench with its monitor thread replaced by a stub. For each measured window, the trainer thread's
time is split with /proc/thread-self/schedstat into on-CPU time, run-queue wait (other processes had
the core: load) and the rest, blocked (sleeping: the GIL, I/O); its minor page faults come from
getrusage. A round runs each loop once; the order alternates. Linux only.

feedbench's window is found by hooking the harness: the first check_stop() after the synchronize()
that opens the window (so the monitor's start is outside it, as in feedbench's own window) and the
synchronize() that closes it.

    PYTHONPATH=workflow .venv/bin/python benchmarks/own_pipeline_split.py [--rounds 15] [--steps 30]

"Like-for-like" rounds: every window waited under 5 % of its time in the run queue, and the
feedbench windows' page faults are within 20 % of the bare window's (the same allocator regime).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time

import _checkout  # noqa: F401  (this checkout's feedbench, not the venv's: benchmarks/_checkout.py)
import feedbench
import feedbench.harness.loop
import feedbench.harness.runner
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import own_pipeline_overhead as own  # noqa: E402  (the benchmark beside this file)


class NoMonitor:
    """Stands in for feedbench.harness.monitor.Monitor: no sampling thread."""

    def __init__(self, *args):
        pass

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def is_alive(self) -> bool:
        return False

    def summary(self) -> None:
        return None


def snapshot() -> tuple[float, float, float, int]:
    """(wall s, on-CPU s, run-queue wait s, minor faults) of the calling thread."""
    with open("/proc/thread-self/schedstat") as f:
        on_cpu, waiting, _ = (int(x) for x in f.read().split())
    return (
        time.perf_counter(),
        on_cpu / 1e9,
        waiting / 1e9,
        resource.getrusage(resource.RUSAGE_THREAD).ru_minflt,
    )


def split(start, end, samples: int) -> dict:
    wall, cpu, queue = (end[i] - start[i] for i in range(3))
    return {
        "samples_per_s": samples / wall,
        "wall_ms": wall * 1e3,
        "cpu_ms": cpu * 1e3,
        "queue_ms": queue * 1e3,
        "blocked_ms": (wall - cpu - queue) * 1e3,
        "faults_per_step": (end[3] - start[3]) / own.KNOBS["steps"],
        # without the run-queue wait
        "own_samples_per_s": samples / (cpu + max(0.0, wall - cpu - queue)),
    }


class WindowHook:
    """Snapshots at feedbench's window: the first check_stop() after the opening synchronize(), the
    closing one."""

    def __init__(self):
        self.marks: list = []
        self.armed = False
        self.synchronize, self.check_stop = (
            feedbench.harness.loop.synchronize,
            feedbench.harness.loop.check_stop,
        )
        feedbench.harness.loop.synchronize, feedbench.harness.loop.check_stop = (
            self._synchronize,
            self._check_stop,
        )

    def _synchronize(self, device) -> None:
        self.synchronize(device)
        if self.marks:
            self.marks.append(snapshot())
        else:
            self.armed = True

    def _check_stop(self) -> None:
        if self.armed:
            self.armed = False
            self.marks.append(snapshot())
        self.check_stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=own.KNOBS["steps"])
    args = parser.parse_args()
    own.KNOBS["steps"] = args.steps
    torch.set_num_threads(own.KNOBS["torch_threads"])
    device = torch.device("cpu")
    hook = WindowHook()
    monitor = feedbench.harness.runner.Monitor
    with tempfile.TemporaryDirectory() as root:
        ctx = own.Context(0, 1, 0, device, own.KNOBS["batch_size"], 0, 0)
        dataset = own.data.build_dataset(ctx, root=root, shards=4, count=512)
        model = own.models.build_model(ctx).to(device)

        def bare() -> dict:
            marks: list = []
            own.bare_loop(dataset, model, device, mark=lambda: marks.append(snapshot()))
            return split(*marks, own.KNOBS["steps"] * own.KNOBS["batch_size"])

        def instrumented(monitor_class) -> dict:
            feedbench.harness.runner.Monitor = monitor_class
            hook.marks, hook.armed = [], False
            result = feedbench.measure(
                dataset=dataset, model=model, collate=own.data.collate, step=own.train.train_step, device="cpu",  # noqa: E501
                **own.KNOBS,
            )  # fmt: skip
            assert result["status"] == "ok", result["error"]
            return split(*hook.marks, result["metrics"]["samples"])

        loops = {
            "bare": bare,
            "feedbench": lambda: instrumented(monitor),
            "no-monitor": lambda: instrumented(NoMonitor),
        }
        print(
            f"torch {torch.__version__}, {args.rounds} rounds of {args.steps} steps, load "
            f"average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
        )
        for loop in loops.values():  # one unmeasured round
            loop()
        rows = {name: [] for name in loops}
        for round_ in range(args.rounds):
            names = list(loops) if round_ % 2 == 0 else list(loops)[::-1]
            for name in names:
                rows[name].append(loops[name]())
            print(
                f"round {round_ + 1}: "
                + " | ".join(
                    f"{name} {rows[name][-1]['samples_per_s']:.0f}/s cpu "
                    f"{rows[name][-1]['cpu_ms']:.0f} queue {rows[name][-1]['queue_ms']:.0f} "
                    f"blocked {rows[name][-1]['blocked_ms']:.1f} ms, "
                    f"{rows[name][-1]['faults_per_step']:.0f} faults/step"
                    for name in loops
                ),
                flush=True,
            )
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    bare_rows = rows["bare"]

    def like_for_like(i: int) -> bool:
        quiet = all(rows[n][i]["queue_ms"] < 0.05 * rows[n][i]["wall_ms"] for n in rows)
        base = bare_rows[i]["faults_per_step"]
        return quiet and all(
            abs(rows[n][i]["faults_per_step"] - base) <= 0.2 * max(base, 1) for n in rows
        )

    same = [i for i in range(args.rounds) if like_for_like(i)]
    for name in list(loops)[1:]:
        wall = [
            r["samples_per_s"] / b["samples_per_s"]
            for r, b in zip(rows[name], bare_rows, strict=True)
        ]
        own_time = [
            r["own_samples_per_s"] / b["own_samples_per_s"]
            for r, b in zip(rows[name], bare_rows, strict=True)
        ]
        print(
            f"{name} / bare: wall ratio median {statistics.median(wall):.3f}; without run-queue "
            f"wait {statistics.median(own_time):.3f}; like-for-like rounds ({len(same)}): "
            + (f"{statistics.median(wall[i] for i in same):.3f}" if same else "none")
            + f" ({', '.join(f'{wall[i]:.3f}' for i in same)})"
        )
    for name in loops:
        faults = [r["faults_per_step"] for r in rows[name]]
        print(
            f"{name}: median blocked {statistics.median(r['blocked_ms'] for r in rows[name]):.1f}"
            f" ms a window, faults/step median {statistics.median(faults):.0f} (min "
            f"{min(faults):.0f}, max {max(faults):.0f})"
        )


if __name__ == "__main__":
    main()
