"""How many CPU threads a run gets, and how busy other processes keep the machine.

Thread count (``threads_for_run``): an explicit count wins; otherwise the cores this process
may run on (its affinity mask) minus those other processes keep busy, measured over a short
probe of ``/proc/stat`` when the run starts. ggml's threads meet at a barrier after every op,
so one thread that shares its core with another process holds all the others back: on a 2-core
machine with one busy loop, two threads decoded 2.65x slower than one (docs/results/busy-machine/README.md).

Waiting threads: the CPU wheel runs ggml's own thread pool (runtime/threadpool.py), whose idle
workers spin a few milliseconds for the next graph, then sleep. The CUDA wheel keeps OpenMP and
libgomp's defaults: a shorter libgomp spin (``GOMP_SPINCOUNT``) cost nothing idle but decoded 3x
slower beside a competitor that arrived mid-run (docs/results/busy-machine/README.md).

Load meter (``CpuMeter``): CPU time the cores used that this process did not use, as cores'
worth on average between two snapshots; ``laguna-run bench`` reports it, because tokens/s
and speedups measured beside another job mean less.

CPU facts (``cpu_facts``): the model, the flags that decide which of ggml's CPU kernels run,
and the core counts, which every benchmark's results record: a figure means little without
the CPU it was measured on.
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass
from typing import Callable

#: llama.cpp's thread pool refuses more (GGML_MAX_N_THREADS) with an abort
MAX_THREADS = 512
#: seconds of /proc/stat watched before choosing the thread count: 10 ticks per core at the
#: usual 100 Hz tick, enough to tell a busy core (about 10) from an idle one (about 0)
PROBE_S = 0.1
#: another process using at least this much of a core takes it away from the thread count
TAKEN_CORE = 0.5
#: other processes using more than this many cores on average during a bench make its
#: ratios suspect
BUSY_WARN_CORES = 0.3

#: /proc/cpuinfo's identifying numbers (x86, Arm) and the names ``cpu_facts`` gives them
CPUID_FIELDS = {"cpu family": "family", "model": "model", "stepping": "stepping",
                "CPU implementer": "implementer", "CPU part": "part"}

#: /proc/cpuinfo flags (by prefix) that decide which of ggml's CPU kernels run: x86's vector
#: and matrix extensions (``pni`` is the kernel's name for SSE3), Arm's SIMD, dot-product and
#: matrix ones
KERNEL_FLAG_PREFIXES = ("avx", "amx", "fma", "f16c", "bmi2", "sse4", "ssse3", "pni",
                        "asimd", "sve", "dotprod", "i8mm", "bf16", "fphp")

# /proc/stat columns: user nice system idle iowait irq softirq steal guest guest_nice;
# guest time is already counted in user and nice, so it is left out
_BUSY_COLUMNS = (0, 1, 2, 5, 6, 7)
_IDLE_COLUMNS = (3, 4)


@dataclass(frozen=True)
class CpuTicks:
    busy: int
    total: int


@dataclass(frozen=True)
class Snapshot:
    cpus: dict[int, CpuTicks]  # per core, from /proc/stat
    own: int  # this process's utime + stime


def parse_proc_stat(text: str) -> dict[int, CpuTicks]:
    """Busy and total ticks of each ``cpuN`` line of /proc/stat."""
    cpus = {}
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if not (name.startswith("cpu") and name[3:].isdigit()):
            continue
        values = [int(v) for v in rest.split()]
        values += [0] * (8 - len(values))  # older kernels print fewer columns
        busy = sum(values[i] for i in _BUSY_COLUMNS)
        cpus[int(name[3:])] = CpuTicks(busy, busy + sum(values[i] for i in _IDLE_COLUMNS))
    return cpus


def parse_own_ticks(text: str) -> int:
    """utime + stime of a /proc/PID/stat line (the command name may hold spaces and parentheses)."""
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[11]) + int(fields[12])  # fields 14 and 15 of proc(5), counted from the state


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def affinity() -> set[int]:
    """The cores this process may run on (all of them where the OS has no affinity call)."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def cpu_features(system_info: str) -> list[str]:
    """The CPU backend's features that are on, from llama_print_system_info's
    ``CPU : SSE3 = 1 | AVX = 1 | ...``: what the build was compiled for, which decides its
    kernels (the /proc/cpuinfo flags of ``cpu_facts`` say what the CPU could run)."""
    cpu = next((part for part in system_info.split("CPU :")[1:2]), "")
    return [name.strip() for name, _, on in (item.partition("=") for item in cpu.split("|"))
            if name.strip() and on.strip() == "1"]


def cpu_facts() -> dict:
    """The CPU a measurement ran on: ``model`` (/proc/cpuinfo's model name), ``cpuid`` (its
    identifying numbers, x86's family, model and stepping or Arm's implementer and part: a VM's
    name alone, "AMD EPYC", covers cores years apart), ``flags`` (its flags, or Arm's Features,
    among KERNEL_FLAG_PREFIXES, sorted), ``cores`` (the machine's logical CPUs,
    ``os.cpu_count()``) and ``affinity_cores`` (those this process may run on, which the default
    thread count starts from). Without /proc/cpuinfo: the platform's processor name, no numbers
    and no flags."""
    model, flags, ids = "", set(), {}
    try:
        text = _read("/proc/cpuinfo")
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "" and (model or flags):
            break  # the first processor's block describes them all
        if key == "model name" and not model:
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = {f for f in value.split() if f.startswith(KERNEL_FLAG_PREFIXES)}
        elif key in CPUID_FIELDS:
            ids.setdefault(key, value.strip())
    cpuid = " ".join(f"{name} {ids[key]}" for key, name in CPUID_FIELDS.items() if key in ids)
    return {"model": model or platform.processor() or platform.machine(), "cpuid": cpuid,
            "flags": sorted(flags), "cores": os.cpu_count(), "affinity_cores": len(affinity())}


class CpuMeter:
    """Snapshots of the ticks of ``cpus`` and of this process; ``None`` where /proc is missing."""

    def __init__(self, cpus: set[int] | None = None,
                 read_stat: Callable[[], str] = lambda: _read("/proc/stat"),
                 read_own: Callable[[], str] = lambda: _read("/proc/self/stat")) -> None:
        self.cpus = affinity() if cpus is None else set(cpus)
        self._read_stat = read_stat
        self._read_own = read_own

    def snapshot(self) -> Snapshot | None:
        try:
            return Snapshot(parse_proc_stat(self._read_stat()), parse_own_ticks(self._read_own()))
        except (OSError, ValueError, IndexError):
            return None

    def others_busy_cores(self, before: Snapshot | None, after: Snapshot | None) -> float | None:
        """Cores' worth of CPU time that other processes used on our cores between the two
        snapshots: their busy ticks less ours, over the ticks one core counted meanwhile."""
        if before is None or after is None:
            return None
        cpus = [c for c in sorted(self.cpus) if c in before.cpus and c in after.cpus]
        if not cpus:
            return None
        busy = sum(after.cpus[c].busy - before.cpus[c].busy for c in cpus)
        total = sum(after.cpus[c].total - before.cpus[c].total for c in cpus)
        if total <= 0:
            return None
        others = max(0, busy - (after.own - before.own))
        return others * len(cpus) / total


@dataclass(frozen=True)
class CoreCount:
    usable: int  # cores in the affinity mask
    others_busy: float | None  # cores' worth used by other processes during the probe; None: not measured

    @property
    def free(self) -> int:
        """The usable cores no other process keeps busy (at least 1)."""
        if self.others_busy is None:
            return self.usable
        return max(1, self.usable - int(self.others_busy + (1 - TAKEN_CORE)))


def probe_cores(meter: CpuMeter | None = None, probe_s: float = PROBE_S,
                sleep: Callable[[float], None] = time.sleep) -> CoreCount:
    meter = meter or CpuMeter()
    before = meter.snapshot()
    if before is not None:
        sleep(probe_s)
    return CoreCount(len(meter.cpus), meter.others_busy_cores(before, meter.snapshot()))


def threads_for_run(requested: int = 0, slots: int = 1) -> int:
    """The CPU threads of each of ``slots`` engines: ``requested`` when given (> 0), else the
    free cores shared among the slots, at least 1 each."""
    if requested > 0:
        return requested
    count = probe_cores()
    return max(1, min(MAX_THREADS, count.free // max(1, slots)))


def busy_warning(others_busy: float | None) -> str | None:
    """The line a benchmark prints when other processes shared the machine."""
    if others_busy is None or others_busy <= BUSY_WARN_CORES:
        return None
    return (f"warning: other processes kept {others_busy:.1f} cores busy on average during the run; "
            "tokens/s and speedups measured beside them mean less")

