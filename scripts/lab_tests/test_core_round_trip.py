"""scripts/bench/core_round_trip.c, built and read as scripts/investigate/core_distance.py does."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from scripts.investigate.core_distance import build_round_trip, by_class, classify, round_trip_ns

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")


@pytest.fixture(scope="module")
def binary(tmp_path_factory):
    return build_round_trip(tmp_path_factory.mktemp("core_round_trip"))


@pytest.mark.skipif(not {0, 1} <= os.sched_getaffinity(0), reason="needs CPUs 0 and 1")
def test_a_round_trip_between_cpus_0_and_1_is_a_positive_time(binary):
    ns = round_trip_ns(binary, 2000)
    # a cache line's round trip between two cores: more than a nanosecond, far less than a millisecond
    assert 1.0 < ns < 1e6


def test_a_cpu_the_machine_lacks_and_a_count_under_one_are_one_line_and_exit_code_2(binary):
    missing = max(os.sched_getaffinity(0)) + 1
    for args, line in ([("0", str(missing), "10"), f"core_round_trip: cannot run on CPU {missing}\n"],
                       [("0", "0", "0"), "core_round_trip: ROUNDS: expected >= 1, found 0\n"]):
        out = subprocess.run([str(binary), *args], capture_output=True, text=True)
        assert (out.returncode, out.stdout, out.stderr) == (2, "", line)


def test_samples_are_near_only_when_both_round_trips_are():
    assert [classify(b, a, 200.0) for b, a in ((90, 110), (90, 450), (460, 120), (470, 480))] == \
        ["near", "mixed", "mixed", "far"]


def test_samples_are_grouped_by_class_near_first_and_empty_classes_left_out():
    samples = [{"class": c} for c in ("far", "near", "far")]
    assert {cls: len(rows) for cls, rows in by_class(samples).items()} == {"near": 1, "far": 2}
    assert list(by_class(samples)) == ["near", "far"]
