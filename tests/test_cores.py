"""The default thread count counts the cores other processes leave free (runtime/cores.py): the
/proc/stat arithmetic on fake snapshots, the affinity mask, an explicit -t winning, and bench
saying when the machine was busy and on which CPU it ran."""

from __future__ import annotations

import json
import os

import pytest

from laguna_dflash.runtime import assets, cores
from laguna_dflash.runtime.cli import main
from laguna_dflash.runtime.cores import CoreCount, CpuMeter

OWN = "4242 (laguna (x) run) S 1 4242 4242 0 -1 4194304 10 0 0 0 {utime} {stime} 0 0 20 0 3 0 100 0 0"


def proc_stat(*cpus: tuple[int, int, int]) -> str:
    """A /proc/stat text with one line per (user, system, idle) triple; guest ticks (already
    inside user) and an aggregate line that a parser must not take for a core."""
    lines = ["cpu  999999 0 999999 999999 0 0 0 0 0 0"]
    for i, (user, system, idle) in enumerate(cpus):
        lines.append(f"cpu{i} {user} 0 {system} {idle} 0 0 0 0 {user // 2} 0")
    lines += ["intr 1 2 3", "ctxt 12345", "cpus_online 2"]
    return "\n".join(lines) + "\n"


def meter(stats: list[str], own: list[tuple[int, int]], cpus=None) -> CpuMeter:
    stats, own = iter(stats), iter(own)
    return CpuMeter(cpus if cpus is not None else {0, 1}, read_stat=lambda: next(stats),
                    read_own=lambda: OWN.format(**dict(zip(("utime", "stime"), next(own)))))


# ------------------------------------------------------------------ the probe's arithmetic


def test_a_core_kept_busy_by_another_process_is_not_free():
    # 10 ticks pass per core: core 0 all busy (the competitor), core 1 busy 4 (our own 3 + 1)
    m = meter([proc_stat((100, 50, 500), (100, 50, 500)), proc_stat((108, 52, 500), (103, 51, 506))],
              own=[(7, 2), (9, 3)])
    before, after = m.snapshot(), m.snapshot()
    assert m.others_busy_cores(before, after) == pytest.approx((10 + 4 - 3) * 2 / 20)
    count = cores.probe_cores(meter([proc_stat((100, 50, 500), (100, 50, 500)),
                                     proc_stat((108, 52, 500), (103, 51, 506))], own=[(7, 2), (9, 3)]),
                              sleep=lambda s: None)
    assert count == CoreCount(usable=2, others_busy=pytest.approx(1.1))
    assert count.free == 1


def test_our_own_ticks_are_not_counted_as_another_process():
    # both cores busy the whole time, all of it ours: the machine is free for us
    m = meter([proc_stat((0, 0, 0), (0, 0, 0)), proc_stat((10, 0, 0), (8, 2, 0))], own=[(0, 0), (17, 3)])
    assert m.others_busy_cores(m.snapshot(), m.snapshot()) == 0.0
    assert CoreCount(2, 0.0).free == 2


def test_only_the_cores_in_the_affinity_mask_count():
    # cores 2 and 3 are saturated by others, but this process may run on 0 and 1 only
    busy_elsewhere = [proc_stat((0, 0, 0), (0, 0, 0), (0, 0, 0), (0, 0, 0)),
                      proc_stat((0, 0, 10), (1, 0, 9), (10, 0, 0), (10, 0, 0))]
    count = cores.probe_cores(meter(busy_elsewhere, own=[(0, 0), (0, 0)], cpus={0, 1}), sleep=lambda s: None)
    assert count.usable == 2 and count.others_busy == pytest.approx(0.1) and count.free == 2
    count = cores.probe_cores(meter(busy_elsewhere, own=[(0, 0), (0, 0)], cpus={0, 1, 2, 3}),
                              sleep=lambda s: None)
    assert count.usable == 4 and count.free == 2


def test_the_real_affinity_mask_is_what_the_meter_watches():
    assert CpuMeter().cpus == set(os.sched_getaffinity(0))


@pytest.mark.parametrize("others, usable, free", [(0.0, 2, 2), (0.49, 2, 2), (0.5, 2, 1), (1.6, 4, 2),
                                                   (3.0, 2, 1), (1.0, 1, 1), (None, 3, 3)])
def test_a_core_counts_as_taken_from_half_a_core_used_and_one_always_stays(others, usable, free):
    assert CoreCount(usable, others).free == free


def test_without_proc_the_probe_falls_back_to_the_affinity_count():
    def missing():
        raise FileNotFoundError("/proc/stat")

    def no_sleep(s):
        raise AssertionError("nothing to wait for without /proc")

    count = cores.probe_cores(CpuMeter({0, 1, 2}, read_stat=missing, read_own=missing), sleep=no_sleep)
    assert count == CoreCount(3, None) and count.free == 3


def test_the_real_probe_reads_this_machine():
    count = cores.probe_cores()
    assert count.usable == len(os.sched_getaffinity(0))
    assert count.others_busy is not None and 0 <= count.others_busy <= count.usable + 0.5
    assert 1 <= count.free <= count.usable


# ------------------------------------------------------------------ the thread count of a run


@pytest.fixture
def probed(monkeypatch):
    """Replace the probe by a fixed CoreCount and count the calls to it."""
    def use(count: CoreCount):
        calls = {"probe": 0}

        def probe():
            calls["probe"] += 1
            return count

        monkeypatch.setattr(cores, "probe_cores", probe)
        return calls

    return use


def test_an_explicit_thread_count_wins_without_a_probe(probed):
    calls = probed(CoreCount(2, 1.0))
    assert cores.threads_for_run(3) == 3 and cores.threads_for_run(1, slots=4) == 1
    assert calls == {"probe": 0}


def test_the_default_is_the_free_cores(probed):
    calls = probed(CoreCount(2, 1.0))
    assert cores.threads_for_run(0) == 1 and calls == {"probe": 1}
    calls = probed(CoreCount(2, 0.1))
    assert cores.threads_for_run(0) == 2 and calls == {"probe": 1}


def test_server_slots_share_the_free_cores(probed):
    probed(CoreCount(8, 2.0))
    assert cores.threads_for_run(0, slots=3) == 2
    assert cores.threads_for_run(0, slots=16) == 1


def test_the_default_stays_within_what_llama_cpp_accepts(probed):
    probed(CoreCount(1024, 0.0))
    assert cores.threads_for_run(0) == cores.MAX_THREADS == 512


def test_the_cli_passes_an_explicit_t_and_probes_without_one(probed):
    from laguna_dflash.runtime.cli.options import PairFlags, engine_config

    calls = probed(CoreCount(4, 1.2))
    assert engine_config(PairFlags(threads=5))[0].n_threads == 5 and calls["probe"] == 0
    cfg, placement = engine_config(PairFlags(threads=0))
    assert cfg.n_threads == 3 and calls["probe"] == 1
    assert placement.describe().endswith(", 3 CPU threads")  # a run's --json and bench's say what was chosen


def test_an_engine_counts_once_and_gives_the_drafter_the_same_threads(probed):
    from laguna_dflash.runtime.engine import Engine, EngineConfig

    calls = probed(CoreCount(4, 1.0))
    with Engine.load(assets.TINY_TARGET, assets.converted_tiny_drafter(), EngineConfig(n_ctx=256)) as engine:
        assert engine.ctx.n_threads == 3 and engine.drafter.ctx.n_threads == 3
    assert calls["probe"] == 1
    with Engine.load(assets.TINY_TARGET, assets.converted_tiny_drafter(), EngineConfig(n_ctx=256, n_threads=2)) as e:
        assert e.ctx.n_threads == 2 and e.drafter.ctx.n_threads == 2
    assert calls["probe"] == 1


# ------------------------------------------------------------------ bench says when the machine was busy


class BusyMeter(CpuMeter):
    """Two snapshots 100 ticks per core apart; others used ``others`` cores' worth of 2 cores."""

    def __init__(self, others: float) -> None:
        busy = round(others * 100)
        super().__init__({0, 1}, read_stat=None, read_own=None)
        self._snaps = iter([proc_stat((0, 0, 0), (0, 0, 0)),
                            proc_stat((busy // 2 + 50, 0, 50 - busy // 2), (busy - busy // 2 + 50, 0,
                                                                              50 - busy + busy // 2))])
        self._own = iter([(0, 0), (100, 0)])  # our own decode: one core's worth

    def snapshot(self):
        return cores.Snapshot(cores.parse_proc_stat(next(self._snaps)),
                              cores.parse_own_ticks(OWN.format(**dict(zip(("utime", "stime"), next(self._own))))))


@pytest.mark.parametrize("others, warned", [(0.8, True), (0.3, False)])
def test_bench_records_and_warns_about_other_processes(tmp_path, monkeypatch, capsys, others, warned):
    import laguna_dflash.runtime.bench as bench

    monkeypatch.setattr(bench, "CpuMeter", lambda: BusyMeter(others))
    out = tmp_path / "bench.json"
    assert main(["bench", "-n", "4", "--n-max", "2", "-t", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["machine_busy_cores"] == pytest.approx(others)
    assert result["cpu"] == cores.cpu_facts()
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "warning" in ln]
    if warned:
        assert lines == [f"warning: other processes kept {others:.1f} cores busy on average during the run; "
                         "tokens/s and speedups measured beside them mean less"]
    else:
        assert lines == []


def test_the_warning_threshold():
    assert cores.busy_warning(None) is None and cores.busy_warning(cores.BUSY_WARN_CORES) is None
    assert "1.3 cores busy" in cores.busy_warning(1.26)



def proc_cpuinfo() -> dict[str, str]:
    """This machine's first processor's fields (x86 Linux), read here independently of cores.py."""
    fields: dict[str, str] = {}
    if os.path.exists("/proc/cpuinfo"):
        for line in open("/proc/cpuinfo").read().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    if "model name" not in fields or "flags" not in fields:
        pytest.skip("no x86 /proc/cpuinfo here")
    return fields


def test_cpu_facts_are_this_machines():
    fields = proc_cpuinfo()
    model, flags = fields["model name"], set(fields["flags"].split())
    facts = cores.cpu_facts()
    assert facts["model"] == model != ""
    assert facts["flags"] == sorted(facts["flags"]) and set(facts["flags"]) <= flags
    # every kernel-relevant flag the CPU has is kept, and only those
    assert set(facts["flags"]) == {f for f in flags if f.startswith(cores.KERNEL_FLAG_PREFIXES)}
    if "avx2" in flags:
        assert "avx2" in facts["flags"] and "fma" in facts["flags"]
    assert not {"fpu", "sse", "sse2", "lm"} & set(facts["flags"])
    assert facts["cores"] == os.cpu_count()
    assert facts["affinity_cores"] == len(os.sched_getaffinity(0))
    assert facts["cpuid"] == f"family {fields['cpu family']} model {fields['model']} stepping {fields['stepping']}"


X86_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
stepping\t: 1
flags\t\t: fpu avx2 avx512f avx512_vnni

processor\t: 1
cpu family\t: 99
model\t\t: 99
model name\t: AMD EPYC
"""
ARM_CPUINFO = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd asimddp i8mm
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x1
CPU part\t: 0xd40

"""


@pytest.mark.parametrize("text, model, cpuid", [
    (X86_CPUINFO, "AMD EPYC", "family 25 model 17 stepping 1"),
    (ARM_CPUINFO, None, "implementer 0x41 part 0xd40"),
    ("", None, ""),
])
def test_cpu_facts_name_the_first_processors_numbers(monkeypatch, text, model, cpuid):
    # two cores of one name can be years apart (Zen 3 and Zen 4 both call themselves "AMD EPYC")
    monkeypatch.setattr(cores, "_read", lambda path: text)
    facts = cores.cpu_facts()
    assert facts["cpuid"] == cpuid
    if model:
        assert facts["model"] == model and facts["flags"] == ["avx2", "avx512_vnni", "avx512f"]
