"""The policy entry's allow_no_btf reaches the loader; a refused BTF is the caller's error."""

from __future__ import annotations

from typing import Any

import pytest

from gfxbpf.bpf.loader import LoadError
from gfxbpf.broker import instances
from gfxbpf.broker.errors import BrokerError
from gfxbpf.proto import gfxbpf_pb2 as pb


class _Inst:
    def attach(self, *_a: Any, **_k: Any) -> None:
        pass

    def close(self) -> None:
        pass


class _Opened:
    """bpf.instance.Opened's load(), recording what it was asked."""

    def __init__(self, refuse: bool = False) -> None:
        self.kwargs: dict[str, Any] = {}
        self.refuse = refuse

    def load(self, **kwargs: Any) -> _Inst:
        self.kwargs = kwargs
        if self.refuse:
            raise LoadError("object 'x': the kernel refused the object's BTF (Invalid argument)")
        return _Inst()


@pytest.mark.parametrize("allowed", [False, True])
def test_allow_no_btf_is_passed_to_the_loader(allowed: bool) -> None:
    opened = _Opened()
    instances._load(opened, ["m"], allowed)  # type: ignore[arg-type]
    assert opened.kwargs == {"read_only": ["m"], "allow_no_btf": allowed}


def test_a_refused_btf_is_a_kernel_error_naming_it() -> None:
    with pytest.raises(BrokerError) as e:
        instances._load(_Opened(refuse=True), [], False)  # type: ignore[arg-type]
    assert e.value.code == pb.ERROR_KERNEL
    assert "refused the object's BTF" in str(e.value)
