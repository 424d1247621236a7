"""A kernel refusal of an object's BTF is never silently dropped: the load
fails with the kernel's reason, unless the caller explicitly allows loading
without BTF (allow_no_btf; the policy's `allow_no_btf`, `python -m gfxbpf.bpf
load --allow-no-btf`); then the refusal is logged and printed."""

from __future__ import annotations

import errno
import json
import logging
import subprocess
import sys

import pytest

from gfxbpf.bpf import loader
from gfxbpf.bpf import syscall as bpfsys
from gfxbpf.bpf.object import ObjectSpec
from gfxbpf.catalog.entries import load_catalog
from gfxbpf.catalog.objects import object_path

CATALOG = load_catalog()
OBJECT = str(object_path(CATALOG.get("syscount")))

REFUSE_BTF = (
    "import errno, sys\n"
    "import gfxbpf.bpf.syscall as s\n"
    "def refuse(*a, **k):\n"
    "    raise s.BpfError(errno.EINVAL, 'BPF_BTF_LOAD')\n"
    "s.btf_load = refuse\n"
    "from gfxbpf.bpf.__main__ import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def _refuse(*args: object, **kwargs: object) -> int:
    raise bpfsys.BpfError(errno.EINVAL, "BPF_BTF_LOAD")


def test_refused_btf_fails_the_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bpfsys, "btf_load", _refuse)
    with pytest.raises(loader.LoadError) as e:
        loader.load(ObjectSpec.from_file(OBJECT))
    assert str(e.value).startswith("object 'syscount': the kernel refused the object's BTF")
    assert "permission to load without BTF" in str(e.value)


def test_refused_btf_is_kept_and_logged_when_allowed(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(bpfsys, "btf_load", _refuse)
    with caplog.at_level(logging.WARNING, logger="gfxbpf.bpf.loader"):
        with loader.load(ObjectSpec.from_file(OBJECT), allow_no_btf=True) as obj:
            assert obj.btf_fd == -1 and obj.programs
            assert obj.btf_error is not None and "BPF_BTF_LOAD failed" in obj.btf_error
    (record,) = [r for r in caplog.records if r.name == "gfxbpf.bpf.loader"]
    assert "kernel refused the object's BTF" in record.getMessage()
    assert "syscount" in record.getMessage()


def test_accepted_btf_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="gfxbpf.bpf.loader"):
        with loader.load(ObjectSpec.from_file(OBJECT)) as obj:
            assert obj.btf_fd >= 0 and obj.btf_error is None
    assert not [r for r in caplog.records if r.name == "gfxbpf.bpf.loader"]


def test_cli_load_fails_on_the_refusal() -> None:
    r = subprocess.run(
        [sys.executable, "-c", REFUSE_BTF, "load", OBJECT],
        input="",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0 and not r.stdout
    assert r.stderr.startswith("error: object 'syscount': the kernel refused the object's BTF")
    assert "Traceback" not in r.stderr


def test_cli_load_prints_the_refusal_when_allowed() -> None:
    r = subprocess.run(
        [sys.executable, "-c", REFUSE_BTF, "load", "--allow-no-btf", OBJECT],
        input="",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["programs"]
    assert r.stderr.startswith("warning: object 'syscount': kernel refused the object's BTF: ")
    assert "BPF_BTF_LOAD failed" in r.stderr
