"""The Grafana dashboard queries only metrics gfxbpf-exporter really emits.

The emitted names are derived by running the exporter's own mapping
(gfxbpf.exporter.mapping) over every visible map of the catalog, with table
columns taken from each object's BTF as the exporter takes them from the
broker's reply, plus the collector's own status metrics.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from gfxbpf.bpf.object import ObjectSpec
from gfxbpf.catalog.entries import load_catalog
from gfxbpf.catalog.objects import object_path
from gfxbpf.exporter import kernels, mapping, tables
from gfxbpf.exporter.collector import STATUS_SAMPLES

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "gfxbpf-dashboard.json"

PROMQL_WORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
}


def catalog_shapes() -> list[mapping.MapShape]:
    shapes = []
    for entry in load_catalog():
        spec = ObjectSpec.from_file(str(object_path(entry)))
        for m in entry.visible_maps:
            members: tuple[str, ...] = ()
            kmap = spec.maps[m.name]
            # As the exporter does (session.shape_of): a value without BTF
            # (a stack-trace map) has no columns.
            if m.show == "table" and spec.btf is not None and kmap.value_type_id:
                zero = spec.btf.decode(kmap.value_type_id, bytes(kmap.value_size))
                members = mapping.table_members(zero, m.metrics)
            shapes.append(
                mapping.MapShape(
                    entry.name, m.name, m.show or "", m.unit or "", m.key_label or "", members
                )
            )
    return shapes


def emitted_names() -> set[str]:
    names = set(STATUS_SAMPLES)
    for shape in catalog_shapes():
        specs = mapping.metric_specs(shape)
        # A table may have no numeric column (e.g. stack frames); every other role maps.
        assert specs or shape.show == "table", f"{shape.program}/{shape.map} maps to nothing"
        for spec in specs:
            names |= spec.sample_names()
    return names


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (no full parser: enough for ours)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges (and $__rate_interval)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        rest = text[m.end() :].lstrip()
        if rest.startswith("(") or m.group() in PROMQL_WORDS:
            continue  # a function or an operator
        names.add(m.group())
    return names


def exprs(node: Any) -> list[str]:
    """Every `expr` (panel targets) and query string in the dashboard."""
    out: list[str] = []
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "expr" and isinstance(v, str):
                out.append(v)
            elif k == "definition" and isinstance(v, str):
                out.append(re.sub(r"^label_values\(([^,)]+).*", r"\1", v))
            else:
                out.extend(exprs(v))
    elif isinstance(node, list):
        for v in node:
            out.extend(exprs(v))
    return out


def test_the_name_extractor() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (ring, le) (rate(gfxbpf_x_bucket{instance=~"$i"}'
        "[$__rate_interval]))) / on (ring) group_left gfxbpf_y_total"
    )
    assert metric_names(expr) == {"gfxbpf_x_bucket", "gfxbpf_y_total"}


def test_every_catalog_map_maps_and_names_are_unique() -> None:
    names = emitted_names()
    assert "gfxbpf_syscount_counts_total" in names
    assert "gfxbpf_fence_latency_seconds_bucket" in names
    assert "gfxbpf_vmabind_vm_stats_bound_bytes_total" in names
    families = [s.name for shape in catalog_shapes() for s in mapping.metric_specs(shape)]
    assert len(families) == len(set(families)), "two maps map to one metric name"


def test_listed_metrics_are_numeric_members_and_lookup_tables_emit_none() -> None:
    listed = 0
    for entry in load_catalog():
        spec = ObjectSpec.from_file(str(object_path(entry)))
        for m in entry.visible_maps:
            if m.metrics is None:
                continue
            listed += 1
            kmap = spec.maps[m.name]
            assert spec.btf is not None and kmap.value_type_id, (entry.name, m.name)
            zero = spec.btf.decode(kmap.value_type_id, bytes(kmap.value_size))
            missing = set(m.metrics) - set(mapping.numeric_members(zero))
            assert not missing, f"{entry.name}/{m.name} lists {missing}: not numeric members"
    assert listed >= 7  # the six py_codes and cudakernels' refused
    names = emitted_names()
    assert not [n for n in names if "_py_codes_" in n]
    assert {n for n in names if "_refused_" in n} == {"gfxbpf_cudakernels_refused_polls_total"}
    # a member named just `bytes` carries the unit once
    assert "gfxbpf_cudakernels_copies_bytes_total" in names
    assert not [n for n in names if "_bytes_bytes" in n]


def test_dashboard_parses_and_queries_only_emitted_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = exprs(dashboard)
    assert len(queries) >= 10
    used = set().union(*(metric_names(q) for q in queries))
    unknown = sorted(used - emitted_names())
    assert not unknown, f"the dashboard queries metrics the exporter never emits: {unknown}"


def test_dashboard_has_the_latency_heat_maps() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    heatmaps = [p for p in dashboard["panels"] if p["type"] == "heatmap"]
    used = {n for p in heatmaps for q in exprs(p) for n in metric_names(q)}
    assert {
        "gfxbpf_drmsched_queue_latency_seconds_bucket",
        "gfxbpf_drmsched_run_latency_seconds_bucket",
        "gfxbpf_fence_latency_seconds_bucket",
    } <= used
    for p in heatmaps:
        assert all(t.get("format") == "heatmap" for t in p["targets"]), p["title"]


def test_dashboard_panels_do_not_overlap() -> None:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: dict[tuple[int, int], str] = {}
    for p in panels:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = p["title"]


def cuda_series_labels() -> dict[str, dict[str, set[str]]]:
    """{sample name: {label: values}} the mapping gives the cuda maps, with keys
    decoded from the object's BTF and every function of the table counted once."""
    (entry,) = [e for e in load_catalog() if e.name == "cuda"]
    spec = ObjectSpec.from_file(str(object_path(entry)))
    assert spec.btf is not None
    out: dict[str, dict[str, set[str]]] = {}
    for shape in catalog_shapes():
        if shape.program != "cuda":
            continue
        kmap = spec.maps[shape.map]
        zero_key = spec.btf.decode(kmap.key_type_id, bytes(kmap.key_size))
        entries: list[tuple[Any, Any]] = []
        for index in range(len(tables.CUDA.names)):
            key = {**zero_key, "function": index} if isinstance(zero_key, dict) else 4242
            if isinstance(key, dict) and "tgid" in key:
                key["tgid"] = 4242
            value = dict.fromkeys(shape.value_members, 1) if shape.show == "table" else 1
            entries.append((key, value))
        _collect_labels(out, mapping.build(shape, entries, 1000, tables.CUDA))
    return out


def _collect_labels(out: dict[str, dict[str, set[str]]], built: mapping.Built) -> None:
    """Add each sample's label values to out, by sample name and label."""
    for family in built.families:
        for s in family.samples:
            labels = out.setdefault(s.name, {})
            for k, v in s.labels.items():
                labels.setdefault(k, set()).add(v)


def test_the_cuda_panels_use_labels_and_values_the_exporter_emits() -> None:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    titles = {p["title"] for p in panels}
    assert {
        "CUDA launches per process",
        "CUDA copies by direction",
        "CUDA live device memory",
    } <= titles
    emitted = cuda_series_labels()
    assert emitted["gfxbpf_cuda_calls_total"]["role"] >= {"launch", "copy", "sync"}
    assert emitted["gfxbpf_cuda_bytes_total"]["direction"] >= {"htod", "dtoh", "dtod"}
    assert set(emitted["gfxbpf_cuda_memory_live"]) == {"pid"}
    cuda = [q for p in panels if p["title"].startswith("CUDA") for q in exprs(p)]
    assert len(cuda) >= 4
    for q in cuda:
        (name,) = metric_names(q)
        assert name in emitted, q
        labels = emitted[name]
        for group in re.findall(r"\bby \(([^)]*)\)", q):
            for label in (g.strip() for g in group.split(",")):
                assert label == "instance" or label in labels, (label, q)
        for label, value in re.findall(r'(\w+)="([^"$]*)"', q):
            assert value in labels.get(label, set()), (label, value, q)


def gpu_time_series_labels() -> dict[str, dict[str, set[str]]]:
    """{sample name: {label: values}} the exporter gives cudakernels' maps: keys
    decoded from the object's BTF, relabelled as the exporter relabels them."""
    out: dict[str, dict[str, set[str]]] = {}
    (entry,) = [e for e in load_catalog() if e.name == kernels.PROGRAM]
    spec = ObjectSpec.from_file(str(object_path(entry)))
    assert spec.btf is not None
    for shape in catalog_shapes():
        if shape.program != kernels.PROGRAM or not mapping.metric_specs(shape):
            continue
        kmap = spec.maps[shape.map]
        key: Any = 4242  # a key without BTF (an array's index) reads as a number
        if kmap.key_type_id:
            key = spec.btf.decode(kmap.key_type_id, bytes(kmap.key_size))
        if isinstance(key, dict):
            key.update({k: 1 for k in ("tgid", "uid", "kind", "name_hash") if k in key})
        value = dict.fromkeys(shape.value_members, 1)
        _collect_labels(out, mapping.build(shape, kernels.relabel([(key, value)], {}), 10))
    return out


def test_the_gpu_time_panels_group_by_labels_the_exporter_emits() -> None:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    row = [p for p in panels if p["title"] == "GPU time (program cudakernels)"]
    assert row, "no GPU time row"
    below = sorted(
        (p for p in panels if p["gridPos"]["y"] > row[0]["gridPos"]["y"]),
        key=lambda p: p["gridPos"]["y"],
    )
    gpu = [p for p in below[: next(i for i, p in enumerate(below) if p["type"] == "row")]]
    assert {p["title"] for p in gpu} >= {"GPU busy by user", "Top 10 kernels by GPU time"}
    emitted = gpu_time_series_labels()
    assert emitted["gfxbpf_cudakernels_copies_bytes_total"]["kind"] == {"htod"}
    for q in (q for p in gpu for q in exprs(p)):
        (name,) = metric_names(q)
        assert name in emitted, q
        for group in re.findall(r"\bby \(([^)]*)\)", q):
            for label in (g.strip() for g in group.split(",")):
                assert label == "instance" or label in emitted[name], (label, q)
