"""gfxbpf-exporter's mapping from catalog map roles to Prometheus families (no broker)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from gfxbpf.exporter import mapping
from gfxbpf.exporter.mapping import MapShape
from tests.conftest import skip_or_fail


def samples(family: Metric) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for s in family.samples}


class Static(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def exposition(families: list[Metric]) -> str:
    reg = CollectorRegistry()
    reg.register(Static(families))
    return generate_latest(reg).decode()


def promtool_check(text: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        skip_or_fail("promtool is not installed (Debian package prometheus)")
        return
    r = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stdout + r.stderr


SYSCOUNT = MapShape("syscount", "counts", "counter", "count", "syscall")
FENCE = MapShape("fence", "fence_latency", "log2_histogram", "ns", "driver, timeline")


def test_names_follow_the_role_and_the_unit() -> None:
    assert [s.name for s in mapping.metric_specs(SYSCOUNT)] == ["gfxbpf_syscount_counts"]
    assert mapping.metric_specs(SYSCOUNT)[0].sample_names() == {"gfxbpf_syscount_counts_total"}
    # The program's name is not repeated; ns become seconds.
    (spec,) = mapping.metric_specs(FENCE)
    assert (spec.kind, spec.name, spec.scale) == ("histogram", "gfxbpf_fence_latency_seconds", 1e-9)
    bytes_hist = MapShape("vmabind", "bind_size", "log2_histogram", "bytes", "bind size")
    assert mapping.metric_specs(bytes_hist)[0].name == "gfxbpf_vmabind_bind_size_bytes"
    events = MapShape("execsnoop", "events", "events", "", "exec")
    assert mapping.metric_specs(events)[0].sample_names() == {"gfxbpf_execsnoop_events_total"}
    ns_counter = MapShape("p", "busy", "counter", "ns", "cpu")
    assert mapping.metric_specs(ns_counter)[0].sample_names() == {"gfxbpf_p_busy_seconds_total"}


def test_table_members_are_counters_unless_named_as_levels() -> None:
    shape = MapShape(
        "vmabind",
        "vm_stats",
        "table",
        "",
        "address space",
        ("bytes_bound", "binds", "queue_depth", "wait_ns", "live_bytes", "peak_bytes"),
    )
    got = {s.name: s.kind for s in mapping.metric_specs(shape)}
    assert got == {
        "gfxbpf_vmabind_vm_stats_bound_bytes": "counter",
        "gfxbpf_vmabind_vm_stats_binds": "counter",
        "gfxbpf_vmabind_vm_stats_queue_depth": "gauge",
        "gfxbpf_vmabind_vm_stats_wait_seconds": "counter",
        "gfxbpf_vmabind_vm_stats_live_bytes": "gauge",
        "gfxbpf_vmabind_vm_stats_peak_bytes": "gauge",
    }
    entries = [(7, {"bytes_bound": 4096, "binds": 2, "queue_depth": 3, "wait_ns": 2_000_000_000})]
    built = mapping.build(shape, entries, limit=10)
    values = {f.name: samples(f) for f in built.families}
    key = (("address_space", "7"),)
    assert values["gfxbpf_vmabind_vm_stats_bound_bytes"] == {
        ("gfxbpf_vmabind_vm_stats_bound_bytes_total", key): 4096.0
    }
    assert values["gfxbpf_vmabind_vm_stats_wait_seconds"] == {
        ("gfxbpf_vmabind_vm_stats_wait_seconds_total", key): 2.0
    }
    assert values["gfxbpf_vmabind_vm_stats_queue_depth"] == {
        ("gfxbpf_vmabind_vm_stats_queue_depth", key): 3.0
    }


def test_a_table_lists_its_metrics_and_a_bytes_member_is_named_once() -> None:
    zero = {"polls": 0, "last_ns": 0, "result": 0, "poll_ms": 0, "name": "x"}
    assert mapping.table_members(zero, None) == ("polls", "last_ns", "result", "poll_ms")
    assert mapping.table_members(zero, ("poll_ms", "polls", "gone")) == ("poll_ms", "polls")
    assert mapping.table_members(zero, ()) == ()
    shape = MapShape("cudakernels", "copies", "table", "", "pid", ("copies", "bytes"))
    names = [s.name for s in mapping.metric_specs(shape)]
    assert names == ["gfxbpf_cudakernels_copies_copies", "gfxbpf_cudakernels_copies_bytes"]


def test_counter_keys_become_labels_with_syscall_names() -> None:
    built = mapping.build(SYSCOUNT, [(110, 7), (39, 3), (9999, 1)], limit=10)
    (family,) = built.families
    assert samples(family) == {
        ("gfxbpf_syscount_counts_total", (("syscall", "getppid"),)): 7.0,
        ("gfxbpf_syscount_counts_total", (("syscall", "getpid"),)): 3.0,
        ("gfxbpf_syscount_counts_total", (("syscall", "syscall_9999"),)): 1.0,
    }
    assert built.dropped == {}


def test_struct_keys_label_by_btf_member_and_functions_by_name() -> None:
    shape = MapShape("ucalls", "calls", "counter", "count", "function")
    functions = mapping.Functions(names=("getppid", "getpid"))
    built = mapping.build(shape, [(0, 5), (1, 2)], 10, functions=functions)
    assert set(samples(built.families[0])) == {
        ("gfxbpf_ucalls_calls_total", (("function", "getppid"),)),
        ("gfxbpf_ucalls_calls_total", (("function", "getpid"),)),
    }
    clone = MapShape("clonecount", "counts", "counter", "count", "command")
    built = mapping.build(clone, [({"comm": "bash"}, 4)], 10)
    assert samples(built.families[0]) == {
        ("gfxbpf_clonecount_counts_total", (("comm", "bash"),)): 4.0
    }


def test_log2_histogram_buckets_at_powers_of_two() -> None:
    entries = [
        ({"driver": "i915", "timeline": "rcs0", "slot": 0}, 1),
        ({"driver": "i915", "timeline": "rcs0", "slot": 3}, 4),
        ({"driver": "i915", "timeline": "bcs0", "slot": 1}, 2),
    ]
    built = mapping.build(FENCE, entries, limit=10)
    (family,) = built.families
    got = samples(family)
    rcs = (("driver", "i915"), ("timeline", "rcs0"))
    name = "gfxbpf_fence_latency_seconds"

    def bucket(le: str, labels: tuple[tuple[str, str], ...] = rcs) -> float:
        return got[(name + "_bucket", tuple(sorted((*labels, ("le", le)))))]

    # slot s holds 2^s <= v < 2^(s+1) ns: its upper edge is 2^(s+1) ns, cumulative.
    assert [bucket(le) for le in ("2e-09", "4e-09", "8e-09", "1.6e-08", "+Inf")] == [
        1.0,
        1.0,
        1.0,
        5.0,
        5.0,
    ]
    assert got[(name + "_count", rcs)] == 5.0
    bcs = (("driver", "i915"), ("timeline", "bcs0"))
    assert bucket("4e-09", bcs) == 2.0 and got[(name + "_count", bcs)] == 2.0
    assert not [s for s in family.samples if s.name.endswith("_sum")]  # never invented
    promtool_check(exposition(built.families))


def test_a_slot_only_key_has_no_labels() -> None:
    shape = MapShape("vmabind", "bind_size", "log2_histogram", "bytes", "bind size")
    built = mapping.build(shape, [(12, 3), (13, 1)], limit=10)
    got = samples(built.families[0])
    assert got[("gfxbpf_vmabind_bind_size_bytes_bucket", (("le", "8192.0"),))] == 3.0
    assert got[("gfxbpf_vmabind_bind_size_bytes_bucket", (("le", "16384.0"),))] == 4.0
    assert got[("gfxbpf_vmabind_bind_size_bytes_count", ())] == 4.0


def test_the_series_limit_keeps_the_largest_and_counts_the_rest() -> None:
    entries = [(nr, nr + 1) for nr in range(10_000)]  # a map with 10,000 keys
    built = mapping.build(SYSCOUNT, entries, limit=50)
    (family,) = built.families
    assert len(family.samples) == 50
    assert min(s.value for s in family.samples) == 10_000 - 50 + 1
    assert built.dropped == {"gfxbpf_syscount_counts": 10_000 - 50}
    hist_entries = [({"driver": "d", "timeline": f"t{i}", "slot": 1}, 1) for i in range(30)]
    built = mapping.build(FENCE, hist_entries, limit=4)
    counts = [s for s in built.families[0].samples if s.name.endswith("_count")]
    assert len(counts) == 4 and built.dropped == {"gfxbpf_fence_latency_seconds": 26}


def test_exposition_passes_promtool() -> None:
    families = mapping.build(SYSCOUNT, [(39, 2)], 10).families
    families += mapping.build(
        FENCE, [({"driver": "a", "timeline": "b", "slot": 2}, 1)], 10
    ).families
    spec = mapping.metric_specs(MapShape("execsnoop", "events", "events"))[0]
    families.append(mapping.events_family(spec, 3))
    text = exposition(families)
    assert "gfxbpf_execsnoop_events_total 3.0" in text
    promtool_check(text)


@pytest.mark.parametrize(
    ("text", "want"),
    [("fence_latency", "fence_latency"), ("address space", "address_space"), ("9x", "_9x")],
)
def test_sanitize(text: str, want: str) -> None:
    assert mapping.sanitize(text) == want


def test_array_keys_still_at_zero_are_not_series_yet() -> None:
    # A per-CPU array (summed) holds every syscall number from the start.
    built = mapping.build(SYSCOUNT, [(0, 0), (39, 2), (110, 0)], limit=10)
    assert samples(built.families[0]) == {
        ("gfxbpf_syscount_counts_total", (("syscall", "getpid"),)): 2.0
    }
    entries = [({"ring": "gfx", "slot": 3}, 0), ({"ring": "sdma", "slot": 1}, 4)]
    shape = MapShape("drmsched", "run_latency", "log2_histogram", "ns", "ring")
    counts = [
        s for s in mapping.build(shape, entries, 10).families[0].samples if "_count" in s.name
    ]
    assert [(s.labels, s.value) for s in counts] == [({"ring": "sdma"}, 4.0)]
    depth = MapShape("p", "q", "table", "", "queue", ("queue_depth",))
    gauges = mapping.build(depth, [(1, {"queue_depth": 0})], 10).families[0]
    assert [s.value for s in gauges.samples] == [0.0]  # a level of 0 is a value
